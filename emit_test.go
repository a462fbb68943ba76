package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

func setup(t *testing.T, cfg outbox.Config) (*pgtest.DB, *outbox.Producer) {
	t.Helper()
	db := pgtest.New(t)
	cfg.Tables = db.Tables
	p, err := outbox.NewProducer(cfg)
	require.NoError(t, err)
	return db, p
}

func countRows(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()).Scan(&n))
	return n
}

func TestEmitWritesRowInCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	agg := uuid.New()

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	id, err := p.Emit(ctx, tx, outbox.Event{
		AggregateID: agg, Type: "order.placed",
		Payload: map[string]any{"total_cents": 1234},
		Headers: map[string]string{"traceparent": "00-abc-def-01"},
	})
	require.NoError(t, err)
	require.Positive(t, id)
	require.Equal(t, 0, countRows(t, db), "row must not be visible before commit")
	require.NoError(t, tx.Commit(ctx))

	var (
		gotAgg     uuid.UUID
		typ        string
		payload    []byte
		headers    map[string]string
		dispatched *time.Time
	)
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT aggregate_id, type, payload, headers, dispatched_at FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).
		Scan(&gotAgg, &typ, &payload, &headers, &dispatched))
	require.Equal(t, agg, gotAgg)
	require.Equal(t, "order.placed", typ)
	require.JSONEq(t, `{"total_cents":1234}`, string(payload))
	require.Equal(t, map[string]string{"traceparent": "00-abc-def-01"}, headers)
	require.Nil(t, dispatched)
}

func TestEmitRolledBackLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, countRows(t, db))
}

func TestEmitBatchReturnsIDsInInputOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	var events []outbox.Event
	for i := range 300 {
		events = append(events, outbox.Event{AggregateID: aggs[i%3], Type: "order.placed", Payload: map[string]int{"n": i}})
	}
	var ids []int64
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		ids, err = p.EmitBatch(ctx, tx, events)
		return err
	})
	require.NoError(t, err)
	require.Len(t, ids, 300)
	for i, id := range ids {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT (payload->>'n')::int FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).Scan(&n))
		require.Equal(t, i, n, "id %d", id)
	}
}

func TestEmitSQLWithDatabaseSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	defer sdb.Close()

	tx, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids, err := p.EmitBatchSQL(ctx, tx, []outbox.Event{
		{AggregateID: uuid.New(), Type: "order.placed", Payload: json.RawMessage(`{"quote":"a \"b\" \\ c","n":1}`)},
		{AggregateID: uuid.New(), Type: "order.shipped", Payload: []byte(`[1,2,3]`), Headers: map[string]string{"k": `v"\`}},
	})
	require.NoError(t, err)
	require.Len(t, ids, 2)
	require.NoError(t, tx.Commit())

	var payload string
	var headers map[string]string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT payload::text FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", ids[0]).Scan(&payload))
	require.JSONEq(t, `{"quote":"a \"b\" \\ c","n":1}`, payload)
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT headers FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", ids[1]).Scan(&headers))
	require.Equal(t, map[string]string{"k": `v"\`}, headers)
}

func TestEmitRejectsBadInputBeforeWriting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{MaxPayloadBytes: 1024, TopicPrefix: "app."})
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	defer sdb.Close()

	big := make([]byte, 2048)
	_, _ = rand.Read(big)
	bigJSON, _ := json.Marshal(map[string][]byte{"blob": big})
	agg := uuid.New()
	cases := []struct {
		name string
		ev   outbox.Event
		want error
		msg  string
	}{
		{"empty type", outbox.Event{AggregateID: agg, Payload: 1}, outbox.ErrEmptyType, "set Event.Type"},
		{"nil aggregate", outbox.Event{Type: "order.placed", Payload: 1}, outbox.ErrNilAggregate, "set Event.AggregateID"},
		{"invalid json", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: []byte(`{"a":`)}, outbox.ErrInvalidPayload, "not valid JSON"},
		{"nil payload", outbox.Event{AggregateID: agg, Type: "order.placed"}, outbox.ErrInvalidPayload, "payload is nil"},
		{"unmarshalable", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: make(chan int)}, outbox.ErrInvalidPayload, "cannot marshal chan int"},
		{"too large", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: json.RawMessage(bigJSON)}, outbox.ErrPayloadTooLarge, "the limit is 1.0 KiB"},
		{"bad topic char", outbox.Event{AggregateID: agg, Type: "order placed", Payload: 1}, outbox.ErrInvalidTopic, `character ' '`},
		{"empty topic", outbox.Event{AggregateID: agg, Type: ".placed", Payload: 1}, outbox.ErrInvalidTopic, `names no topic`},
		{"long topic", outbox.Event{AggregateID: agg, Type: strings.Repeat("x", 250), Payload: 1}, outbox.ErrInvalidTopic, "at most 249"},
		{"reserved header", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1, Headers: map[string]string{"event_id": "7"}}, outbox.ErrInvalidHeaders, "set by the relayer"},
		{"nul in payload", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]string{"s": "a\x00b"}}, outbox.ErrInvalidPayload, "NUL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// pgx: the typed error, then the transaction still works and
			// rolls back cleanly.
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			_, err = p.Emit(ctx, tx, tc.ev)
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), tc.msg)
			var one int
			require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "transaction must stay usable")
			require.NoError(t, tx.Rollback(ctx))

			// A bad event anywhere in a batch rejects the whole batch.
			tx, err = db.Pool.Begin(ctx)
			require.NoError(t, err)
			good := outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1}
			_, err = p.EmitBatch(ctx, tx, []outbox.Event{good, tc.ev})
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), "event 1 of 2")
			require.NoError(t, tx.Commit(ctx))

			// database/sql: the same.
			stx, err := sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = p.EmitSQL(ctx, stx, tc.ev)
			require.ErrorIs(t, err, tc.want)
			require.NoError(t, stx.Rollback())
		})
	}
	_, err = p.EmitBatch(ctx, db.Pool, nil)
	require.ErrorIs(t, err, outbox.ErrEmptyBatch)
	require.Equal(t, 0, countRows(t, db), "nothing may be written")
}

// Two transactions emitting for one aggregate: the second waits for the
// first to commit, so its id is larger even though it started inserting
// while the first was open.
func TestEmitAggregateLockOrdersIDsByCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	agg := uuid.New()

	tx1, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	// tx2 draws its id first if the lock does not work.
	tx2, err := db.Pool.Begin(ctx)
	require.NoError(t, err)

	id1, err := p.Emit(ctx, tx1, outbox.Event{AggregateID: agg, Type: "a.b", Payload: 1})
	require.NoError(t, err)

	done := make(chan int64)
	go func() {
		id, err := p.Emit(ctx, tx2, outbox.Event{AggregateID: agg, Type: "a.b", Payload: 2})
		if err != nil {
			t.Error(err)
		}
		done <- id
	}()
	select {
	case <-done:
		t.Fatal("second emitter on the same aggregate did not wait for the first")
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx1.Commit(ctx))
	id2 := <-done
	require.NoError(t, tx2.Commit(ctx))
	require.Greater(t, id2, id1)

	// Another aggregate does not wait.
	tx3, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = p.Emit(ctx, tx3, outbox.Event{AggregateID: agg, Type: "a.b", Payload: 3})
	require.NoError(t, err)
	other := uuid.New()
	ctx4, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = pgx.BeginFunc(ctx4, db.Pool, func(tx pgx.Tx) error {
		_, err := p.Emit(ctx4, tx, outbox.Event{AggregateID: other, Type: "a.b", Payload: 4})
		return err
	})
	require.NoError(t, err)
	require.NoError(t, tx3.Rollback(ctx))
}

// Concurrent writers on few aggregates: per aggregate, id order equals
// commit order. Each writer records the commit sequence it observed.
func TestEmitConcurrentWritersKeepCommitOrderPerAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	_, err := db.Pool.Exec(ctx, "CREATE TABLE commits (seq BIGSERIAL PRIMARY KEY, event_id BIGINT NOT NULL, aggregate_id UUID NOT NULL)")
	require.NoError(t, err)
	aggs := []uuid.UUID{uuid.New(), uuid.New()}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				agg := aggs[(w+i)%2]
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "a.b", Payload: i})
					if err != nil {
						return err
					}
					// The commits row is written last under the same
					// aggregate lock, so its seq follows commit order.
					_, err = tx.Exec(ctx, "INSERT INTO commits (event_id, aggregate_id) VALUES ($1, $2)", id, agg)
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, agg := range aggs {
		rows, err := db.Pool.Query(ctx, "SELECT event_id FROM commits WHERE aggregate_id = $1 ORDER BY seq", agg)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Len(t, ids, 120)
		require.IsIncreasing(t, ids)
	}
}

func TestNewProducerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewProducer(outbox.Config{Tables: outbox.Tables{Outbox: "Events; DROP"}})
	require.ErrorContains(t, err, "not a plain identifier")
	_, err = outbox.NewProducer(outbox.Config{MaxPayloadBytes: -1})
	require.ErrorContains(t, err, "MaxPayloadBytes")
	_, err = outbox.NewProducer(outbox.Config{TopicPrefix: "bad prefix"})
	require.ErrorContains(t, err, "TopicPrefix")
	require.False(t, errors.Is(err, outbox.ErrEmptyType))
}
