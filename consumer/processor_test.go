package consumer_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// dbOnly is setup without a broker, for the transport-agnostic core.
func dbOnly(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	_, err := db.Pool.Exec(context.Background(),
		`CREATE TABLE effects (source TEXT NOT NULL, event_id BIGINT NOT NULL, type TEXT NOT NULL, n INT NOT NULL DEFAULT 1, PRIMARY KEY (source, event_id))`)
	require.NoError(t, err)
	return &bundle{db: db}
}

func (b *bundle) processor(t *testing.T, name string) *consumer.Processor {
	t.Helper()
	p, err := consumer.NewProcessor(consumer.ProcessorConfig{Name: name, Pool: b.db.Pool, Tables: b.db.Tables})
	require.NoError(t, err)
	require.NoError(t, p.Check(context.Background()))
	return p
}

func (b *bundle) processedRows(t *testing.T) int {
	return b.count(t, "SELECT count(*) FROM "+b.db.Tables.ProcessedIdent())
}

func TestProcessSkipsDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	p := b.processor(t, "loyalty")
	ev := consumer.Event{ID: 7, Type: "order.placed", Payload: []byte(`{}`)}

	out, err := p.Process(ctx, ev, record)
	require.NoError(t, err)
	require.Equal(t, consumer.Processed, out)
	for range 3 {
		out, err = p.Process(ctx, ev, record)
		require.NoError(t, err)
		require.Equal(t, consumer.Duplicate, out)
	}
	require.Equal(t, map[string]int{"/7": 1}, b.effects(t))
	require.Equal(t, consumer.ProcessorStats{Processed: 1, Duplicates: 3}, p.Stats())

	// Another consumer name processes the same event once more: dedupe is
	// per name.
	other := b.processor(t, "mailer")
	var ran int
	out, err = other.Process(ctx, ev, func(context.Context, pgx.Tx, consumer.Event) error { ran++; return nil })
	require.NoError(t, err)
	require.Equal(t, consumer.Processed, out)
	require.Equal(t, 1, ran)
	require.Equal(t, 2, b.processedRows(t))
}

func TestProcessHandlerErrorRecordsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	p := b.processor(t, "loyalty")
	ev := consumer.Event{ID: 1, Type: "order.placed", Payload: []byte(`{}`)}

	boom := errors.New("boom")
	_, err := p.Process(ctx, ev, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		require.NoError(t, record(ctx, tx, ev)) // a side effect, then failure
		return boom
	})
	var he *consumer.HandlerError
	require.ErrorAs(t, err, &he)
	require.ErrorIs(t, err, boom)
	require.EqualValues(t, 1, he.EventID)
	require.Empty(t, b.effects(t), "the handler's write must roll back")
	require.Zero(t, b.processedRows(t), "the dedupe row must roll back with the handler")

	// A panic is an error too, with the same rollback.
	_, err = p.Process(ctx, ev, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		require.NoError(t, record(ctx, tx, ev))
		panic("handler bug")
	})
	var pe *consumer.PanicError
	require.ErrorAs(t, err, &pe)
	require.Contains(t, string(pe.Stack), "processor_test.go")
	require.Empty(t, b.effects(t))
	require.Zero(t, b.processedRows(t))

	// Once the handler works, the event is processed: nothing was left
	// behind that would make it look like a duplicate.
	out, err := p.Process(ctx, ev, record)
	require.NoError(t, err)
	require.Equal(t, consumer.Processed, out)
	require.Equal(t, map[string]int{"/1": 1}, b.effects(t))
	require.Equal(t, consumer.ProcessorStats{Processed: 1, HandlerErrors: 2}, p.Stats())
}

func TestProcessSourceDimension(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	p := b.processor(t, "loyalty")

	// Event 42 of two outboxes: two different events.
	for _, src := range []string{"shop-eu", "shop-us", "shop-eu", "shop-us"} {
		_, err := p.Process(ctx, consumer.Event{ID: 42, Source: src, Payload: []byte(`{}`)}, record)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]int{"shop-eu/42": 1, "shop-us/42": 1}, b.effects(t))
	require.Equal(t, consumer.ProcessorStats{Processed: 2, Duplicates: 2}, p.Stats())

	// The batch variant keys on the source too.
	outs, err := p.ProcessBatch(ctx, []consumer.Event{
		{ID: 43, Source: "shop-eu"}, {ID: 43, Source: "shop-us"}, {ID: 43}, {ID: 42, Source: "shop-us"}, {ID: 43, Source: "shop-eu"},
	}, record)
	require.NoError(t, err)
	require.Equal(t, []consumer.Outcome{consumer.Processed, consumer.Processed, consumer.Processed, consumer.Duplicate, consumer.Duplicate}, outs)
	require.Equal(t, map[string]int{"shop-eu/42": 1, "shop-us/42": 1, "shop-eu/43": 1, "shop-us/43": 1, "/43": 1}, b.effects(t))
}

func TestProcessBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	p := b.processor(t, "loyalty")

	_, err := p.Process(ctx, consumer.Event{ID: 2}, record)
	require.NoError(t, err)

	var order []int64
	h := func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		order = append(order, ev.ID)
		return record(ctx, tx, ev)
	}
	// 2 was processed before; 5 comes twice in the batch. Input order is
	// kept although ids are not sorted.
	outs, err := p.ProcessBatch(ctx, []consumer.Event{{ID: 5}, {ID: 1}, {ID: 2}, {ID: 5}, {ID: 3}}, h)
	require.NoError(t, err)
	require.Equal(t, []consumer.Outcome{consumer.Processed, consumer.Processed, consumer.Duplicate, consumer.Duplicate, consumer.Processed}, outs)
	require.Equal(t, []int64{5, 1, 3}, order)
	require.Equal(t, map[string]int{"/1": 1, "/2": 1, "/3": 1, "/5": 1}, b.effects(t))
	require.Equal(t, consumer.ProcessorStats{Processed: 4, Duplicates: 2}, p.Stats())
	require.Equal(t, 4, b.processedRows(t))

	// A failing handler rolls the whole batch back: the events before it
	// are not recorded either, and the error says which one failed.
	boom := errors.New("boom")
	_, err = p.ProcessBatch(ctx, []consumer.Event{{ID: 10}, {ID: 11}, {ID: 1}, {ID: 12}}, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		if ev.ID == 12 {
			return boom
		}
		return record(ctx, tx, ev)
	})
	var he *consumer.HandlerError
	require.ErrorAs(t, err, &he)
	require.ErrorIs(t, err, boom)
	require.Equal(t, 3, he.Index)
	require.EqualValues(t, 12, he.EventID)
	require.Equal(t, 4, b.processedRows(t))
	require.Len(t, b.effects(t), 4)

	// The caller's fallback: one by one, so 10 and 11 commit and 12 can
	// be retried alone.
	for _, id := range []int64{10, 11, 1} {
		_, err := p.Process(ctx, consumer.Event{ID: id}, record)
		require.NoError(t, err)
	}
	require.Equal(t, 6, b.processedRows(t))

	outs, err = p.ProcessBatch(ctx, nil, record)
	require.NoError(t, err)
	require.Empty(t, outs)
	_, err = p.ProcessBatch(ctx, []consumer.Event{{ID: 1}, {ID: 0}}, record)
	require.ErrorIs(t, err, consumer.ErrInvalidEvent)
	require.ErrorContains(t, err, "event 1 of 2")
}

// A BatchHandler gets only the fresh events, in batch order, and writes
// their effects in one statement; a failure or a panic rolls everything
// back.
func TestProcessBatchFunc(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	p := b.processor(t, "loyalty")
	_, err := p.Process(ctx, consumer.Event{ID: 2}, record)
	require.NoError(t, err)

	var got [][]int64
	bulk := func(ctx context.Context, tx pgx.Tx, evs []consumer.Event) error {
		ids := make([]int64, len(evs))
		for i, ev := range evs {
			ids[i] = ev.ID
		}
		got = append(got, ids)
		_, err := tx.Exec(ctx, "INSERT INTO effects (source, event_id, type) SELECT '', id, '' FROM unnest($1::bigint[]) id", ids)
		return err
	}
	outs, err := p.ProcessBatchFunc(ctx, []consumer.Event{{ID: 5}, {ID: 1}, {ID: 2}, {ID: 5}, {ID: 3}}, bulk)
	require.NoError(t, err)
	require.Equal(t, []consumer.Outcome{consumer.Processed, consumer.Processed, consumer.Duplicate, consumer.Duplicate, consumer.Processed}, outs)
	require.Equal(t, [][]int64{{5, 1, 3}}, got)
	require.Equal(t, map[string]int{"/1": 1, "/2": 1, "/3": 1, "/5": 1}, b.effects(t))
	require.Equal(t, consumer.ProcessorStats{Processed: 4, Duplicates: 2}, p.Stats())

	// Redelivered in full: the handler is not called at all.
	outs, err = p.ProcessBatchFunc(ctx, []consumer.Event{{ID: 1}, {ID: 3}}, bulk)
	require.NoError(t, err)
	require.Equal(t, []consumer.Outcome{consumer.Duplicate, consumer.Duplicate}, outs)
	require.Len(t, got, 1)

	for name, h := range map[string]consumer.BatchHandler{
		"error": func(context.Context, pgx.Tx, []consumer.Event) error { return errors.New("boom") },
		"panic": func(ctx context.Context, tx pgx.Tx, evs []consumer.Event) error {
			if err := bulk(ctx, tx, evs); err != nil {
				return err
			}
			panic("bad batch")
		},
	} {
		_, err := p.ProcessBatchFunc(ctx, []consumer.Event{{ID: 10}, {ID: 11}}, h)
		var he *consumer.HandlerError
		require.ErrorAs(t, err, &he, name)
		require.Equal(t, -1, he.Index, name)
		require.ErrorContains(t, err, "batch handler failed", name)
		if name == "panic" {
			var pe *consumer.PanicError
			require.ErrorAs(t, err, &pe)
		}
		require.Equal(t, 4, b.processedRows(t), "%s: nothing recorded", name)
		require.Len(t, b.effects(t), 4, "%s: no effects kept", name)
	}
}

// Deliveries of one event racing on several connections run the handler
// once: the second insert waits for the first transaction and then finds
// the row.
func TestProcessConcurrentDeliveriesRunOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	p := b.processor(t, "loyalty")
	var ran atomic.Int64
	var wg sync.WaitGroup
	outcomes := make([]consumer.Outcome, 6)
	for i := range outcomes {
		wg.Go(func() {
			out, err := p.Process(ctx, consumer.Event{ID: 99}, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
				ran.Add(1)
				_, err := tx.Exec(ctx, "SELECT pg_sleep(0.05)")
				if err != nil {
					return err
				}
				return record(ctx, tx, ev)
			})
			assert.NoError(t, err)
			outcomes[i] = out
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, ran.Load())
	require.ElementsMatch(t, []consumer.Outcome{consumer.Processed, consumer.Duplicate, consumer.Duplicate, consumer.Duplicate, consumer.Duplicate, consumer.Duplicate}, outcomes)
	require.Equal(t, map[string]int{"/99": 1}, b.effects(t))
}

func TestProcessRejectsBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	p := b.processor(t, "loyalty")
	for _, id := range []int64{0, -1} {
		_, err := p.Process(ctx, consumer.Event{ID: id}, record)
		require.ErrorIs(t, err, consumer.ErrInvalidEvent)
		require.ErrorContains(t, err, "positive")
	}
	_, err := p.Process(ctx, consumer.Event{ID: 1}, nil)
	require.ErrorContains(t, err, "nil handler")
	require.Zero(t, b.processedRows(t))
}

func TestProcessorConfigErrors(t *testing.T) {
	t.Parallel()
	b := dbOnly(t)
	for _, tc := range []struct {
		name string
		cfg  consumer.ProcessorConfig
		want string
	}{
		{"empty name", consumer.ProcessorConfig{Pool: b.db.Pool}, "Name is empty"},
		{"blank name", consumer.ProcessorConfig{Name: "  ", Pool: b.db.Pool}, "Name is empty"},
		{"nil pool", consumer.ProcessorConfig{Name: "x"}, "Pool is nil"},
		{"nul in name", consumer.ProcessorConfig{Name: "a\x00b", Pool: b.db.Pool}, "it is stored in a text column"},
		{"bad table", consumer.ProcessorConfig{Name: "x", Pool: b.db.Pool, Tables: outbox.Tables{Processed: "a;b"}}, "processed table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.ErrorContains(t, tc.cfg.WithDefaults().Validate(), tc.want)
			_, err := consumer.NewProcessor(tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}

	// A database that was never migrated: Check says what to run.
	empty := pgtest.New(t, pgtest.Options{NoMigrate: true, MaxConns: 2})
	p, err := consumer.NewProcessor(consumer.ProcessorConfig{Name: "x", Pool: empty.Pool, Tables: empty.Tables})
	require.NoError(t, err)
	require.ErrorContains(t, p.Check(context.Background()), "outbox migrate")
}

// On a database that was never migrated, Check names the command that
// migrates it: 'outbox migrate' alone only lists its subcommands.
func TestCheckOnAnUnmigratedDatabaseSaysMigrateUp(t *testing.T) {
	t.Parallel()
	empty := pgtest.New(t, pgtest.Options{NoMigrate: true, MaxConns: 2})
	p, err := consumer.NewProcessor(consumer.ProcessorConfig{Name: "x", Pool: empty.Pool, Tables: empty.Tables})
	require.NoError(t, err)
	require.ErrorContains(t, p.Check(context.Background()), "run 'outbox migrate up' against the consumer's database")
}
