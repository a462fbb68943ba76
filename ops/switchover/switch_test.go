package switchover_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/ops/switchover"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// switchSetup is a bundle (schema, broker, producer) on the shared
// wal_level=logical cluster, with no slot yet; the slot and the
// publication, whoever creates them, are dropped when the test ends.
func switchSetup(t *testing.T) (*bundle, string) {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6, ServerURL: opstest.NeedLogical(t, "the switch tests")})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	t.Cleanup(func() {
		// The relayers stopped by now (cleanups run in reverse); their
		// walsenders may take a moment to go.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil && walrelay.Teardown(ctx, db.Pool, slot, slot) != nil {
			time.Sleep(100 * time.Millisecond)
		}
	})
	b, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	return &bundle{&opstest.Bundle{DB: db, Broker: b, Producer: p}}, slot
}

// gate holds every Publish until it is opened: a broker that does not
// answer, as far as the relayer can tell.
type gate struct {
	relay.Sink
	open chan struct{}
	once sync.Once
}

func (g *gate) Publish(ctx context.Context, msgs []relay.Message) []error {
	select {
	case <-g.open:
		return g.Sink.Publish(ctx, msgs)
	case <-ctx.Done():
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	}
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// runWAL runs a WAL relayer on the bundle's outbox (it creates the slot
// when missing) and waits until it streams; stop ends it as SIGTERM does.
func (b *bundle) runWAL(t *testing.T, pub relay.Sink, mod func(*walrelay.Config)) (stop func()) {
	t.Helper()
	cfg := walrelay.Config{Common: relay.Common{Pool: b.DB.Pool, Sink: pub, Tables: b.DB.Tables, ShutdownTimeout: 5 * time.Second, Logger: opstest.Logger(t)},
		LeaderPollInterval: 100 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	r, err := walrelay.New(cfg)
	require.NoError(t, err)
	stop = opstest.Start(t, func(ctx context.Context) { require.NoError(t, r.Run(ctx)) })
	slot := walrelay.DefaultNameOf(b.DB.Pool, b.DB.Tables)
	require.Eventually(t, func() bool {
		s, found, err := ops.ReadWALSlot(context.Background(), b.DB.Pool, slot)
		return err == nil && found && s.Active && s.ConfirmedFlushLSN != "0/0"
	}, 30*time.Second, 20*time.Millisecond, "the WAL relayer never streamed the slot")
	return stop
}

func (b *bundle) publisher(t *testing.T) relay.Sink {
	return kafkapub.NewPublisher(b.Client(t), kafkapub.PublisherConfig{})
}

func (b *bundle) ids(t *testing.T, where string) []int64 {
	t.Helper()
	rows, err := b.DB.Pool.Query(context.Background(), "SELECT id FROM "+b.DB.Tables.OutboxIdent()+" WHERE "+where+" ORDER BY id")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// Poll -> WAL: the slot and the publication are created (the publication
// marked as the relay marks it, so a lost slot is noticed), the cut is the
// highest id, and the call returns once the polling relayer has
// dispatched every row up to it, not before; a second call finds both
// and returns at once.
func TestPrepareSwitchToWALWaitsForThePollingRelay(t *testing.T) {
	t.Parallel()
	b, slot := switchSetup(t)
	ctx := context.Background()
	var last int64
	for range 20 {
		last = b.Emit(t, uuid.New(), "order.placed", map[string]int{"n": 1})
	}
	var (
		mu       sync.Mutex
		progress []switchover.DrainProgress
	)
	done := make(chan struct{})
	var res switchover.SwitchToWALResult
	var err error
	go func() {
		defer close(done)
		res, err = switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, switchover.SwitchToWALConfig{Tables: b.DB.Tables, Timeout: time.Minute, ProgressInterval: 100 * time.Millisecond,
			Progress: func(p switchover.DrainProgress) { mu.Lock(); progress = append(progress, p); mu.Unlock() }})
	}()
	// No relayer yet: it waits, and says what for.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(progress) > 0 }, 10*time.Second, 10*time.Millisecond)
	mu.Lock()
	require.Equal(t, switchover.DrainProgress{Cut: last, Pending: 20, Elapsed: progress[0].Elapsed}, progress[0])
	mu.Unlock()
	select {
	case <-done:
		t.Fatalf("returned with rows up to the cut pending: %v", err)
	default:
	}
	cl := b.Client(t)
	r, rerr := relay.New(b.RelayConfig(t, cl))
	require.NoError(t, rerr)
	opstest.RunRelayer(t, r)
	<-done
	require.NoError(t, err)
	require.Equal(t, last, res.Cut)
	require.EqualValues(t, 20, res.PendingAtCut)
	require.True(t, res.Setup.SlotCreated && res.Setup.PublicationCreated, "%+v", res.Setup)
	require.Equal(t, slot, res.Setup.Slot)
	require.NotEqual(t, "0/0", res.Setup.SlotLSN)
	require.Zero(t, b.Count(t, "dispatched_at IS NULL"))

	// Idempotent: both exist, nothing is pending.
	again, err := switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, switchover.SwitchToWALConfig{Tables: b.DB.Tables})
	require.NoError(t, err)
	require.False(t, again.Setup.SlotCreated || again.Setup.PublicationCreated, "%+v", again.Setup)
	require.Equal(t, res.Setup.SlotLSN, again.Setup.SlotLSN)

	// The publication is marked: a slot that disappears is not silently
	// created again by the relay (it would skip what was committed).
	b.Exec(t, `SELECT pg_drop_replication_slot($1)`, slot)
	require.ErrorIs(t, walrelay.Setup(ctx, b.DB.Pool, b.DB.Tables, slot, slot), walrelay.ErrSlotLost)
	_, err = switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, switchover.SwitchToWALConfig{Tables: b.DB.Tables})
	require.ErrorIs(t, err, walrelay.ErrSlotLost)
}

// A held row up to the cut is never dispatched by itself: the wait names
// it (and counts the row waiting behind it) and times out saying what to
// do; rows pending with no relayer at all get the other hint. Once the
// rows go, the switch completes.
func TestPrepareSwitchToWALReportsHeldRows(t *testing.T) {
	t.Parallel()
	b, _ := switchSetup(t)
	ctx := context.Background()
	agg := uuid.New()
	held := b.Emit(t, agg, "order.placed", map[string]int{"n": 1})
	behind := b.Emit(t, agg, "order.paid", map[string]int{"n": 2})
	other := b.Emit(t, uuid.New(), "order.placed", map[string]int{"n": 3})
	b.Exec(t, fmt.Sprintf(`INSERT INTO %s (event_id, aggregate_id, type, reason, error, first_failed_at, failed_at, held_until)
		SELECT id, aggregate_id, type, 'too_large', 'MESSAGE_TOO_LARGE: the record is 2 MiB', now(), now(), now() + interval '1 hour'
		FROM %s WHERE id = $1`, pgx.Identifier{b.DB.Tables.Schema, b.DB.Tables.Outbox + "_failures"}.Sanitize(), b.DB.Tables.OutboxIdent()), held)

	var progress []switchover.DrainProgress
	cfg := switchover.SwitchToWALConfig{Tables: b.DB.Tables, Timeout: 600 * time.Millisecond, ProgressInterval: 100 * time.Millisecond,
		Progress: func(p switchover.DrainProgress) { progress = append(progress, p) }}
	_, err := switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, cfg)
	require.ErrorIs(t, err, switchover.ErrSwitchTimeout)
	require.Contains(t, err.Error(), "3 row(s)")
	require.Contains(t, err.Error(), "2 of them are held")
	require.Contains(t, err.Error(), fmt.Sprintf("held: %d (too_large)", held))
	require.Contains(t, err.Error(), "outbox events retry ID --yes")
	require.Contains(t, err.Error(), "is a polling relayer (outbox relay) running", "the third row is not held: nothing dispatches it")
	require.NotEmpty(t, progress)
	p := progress[len(progress)-1]
	require.EqualValues(t, 3, p.Pending)
	require.EqualValues(t, 2, p.Blocked)
	require.Len(t, p.Held, 1)
	require.Equal(t, held, p.Held[0].ID)
	require.Equal(t, agg, p.Held[0].AggregateID)
	require.Equal(t, "too_large", p.Held[0].Reason)
	require.Contains(t, p.Held[0].LastError, "MESSAGE_TOO_LARGE")

	// Only the held rows left: no relayer hint.
	b.Exec(t, "UPDATE "+b.DB.Tables.OutboxIdent()+" SET dispatched_at = now() WHERE id = $1", other)
	_, err = switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, switchover.SwitchToWALConfig{Tables: b.DB.Tables, Timeout: 300 * time.Millisecond})
	require.ErrorIs(t, err, switchover.ErrSwitchTimeout)
	require.NotContains(t, err.Error(), "is a polling relayer")

	// The operator lets them go (here, as a relayer would once retried).
	b.Exec(t, "UPDATE "+b.DB.Tables.OutboxIdent()+" SET dispatched_at = now() WHERE id IN ($1, $2)", held, behind)
	res, err := switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, switchover.SwitchToWALConfig{Tables: b.DB.Tables, Timeout: 5 * time.Second})
	require.NoError(t, err)
	require.Equal(t, other, res.Cut)
	require.Zero(t, res.PendingAtCut)
}

// A WAL relayer that starts while rows up to the cut are pending (the
// reversal that breaks order) stops the wait at once; a slot a WAL
// relayer reads already means the WAL source runs, and to-wal refuses
// rather than wait for rows the WAL relay never dispatches.
func TestPrepareSwitchToWALRefusesWhileTheSlotIsRead(t *testing.T) {
	t.Parallel()
	b, slot := switchSetup(t)
	ctx := context.Background()
	b.Emit(t, uuid.New(), "order.placed", map[string]int{"n": 1})
	done := make(chan error, 1)
	go func() {
		_, err := switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, switchover.SwitchToWALConfig{Tables: b.DB.Tables, Timeout: time.Minute, ProgressInterval: 100 * time.Millisecond})
		done <- err
	}()
	require.Eventually(t, func() bool {
		_, found, err := ops.ReadWALSlot(ctx, b.DB.Pool, slot)
		return err == nil && found
	}, 10*time.Second, 10*time.Millisecond)
	b.runWAL(t, b.publisher(t), nil)
	select {
	case err := <-done:
		require.ErrorIs(t, err, switchover.ErrSlotInUse)
		require.Contains(t, err.Error(), "a WAL relayer started before the polling relayers had published everything older than the slot")
	case <-time.After(10 * time.Second):
		t.Fatal("the switch went on waiting while a WAL relayer read the slot")
	}

	_, err := switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, switchover.SwitchToWALConfig{Tables: b.DB.Tables, Timeout: time.Second})
	require.ErrorIs(t, err, switchover.ErrSlotInUse)
	require.Contains(t, err.Error(), "slot "+slot+" is read by a WAL relayer")
	require.Contains(t, err.Error(), "stop them now")
}

// WAL -> poll with a producer writing throughout: every row marked
// dispatched is in Kafka (the slot confirmed it before the UPDATE), rows
// committed after the cut stay pending, and the transaction is short. The
// relayer's own heartbeat is off: the switch's message moves the slot.
func TestPrepareSwitchToPollMarksOnlyWhatTheSlotConfirmed(t *testing.T) {
	t.Parallel()
	b, slot := switchSetup(t)
	ctx := context.Background()
	stopWAL := b.runWAL(t, b.publisher(t), func(c *walrelay.Config) { c.HeartbeatInterval = -1 })
	stopProducing := make(chan struct{})
	produced := make(chan int, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stopProducing:
				produced <- n
				return
			default:
			}
			err := pgx.BeginFunc(ctx, b.DB.Pool, func(tx pgx.Tx) error {
				_, err := b.Producer.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"n": n}})
				return err
			})
			if err != nil {
				t.Errorf("emit: %v", err)
			}
			n++
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	var progress []switchover.ConfirmProgress
	res, err := switchover.PrepareSwitchToPoll(ctx, b.DB.Pool, switchover.SwitchToPollConfig{Tables: b.DB.Tables, Timeout: time.Minute,
		ProgressInterval: 100 * time.Millisecond, Progress: func(p switchover.ConfirmProgress) { progress = append(progress, p) }})
	time.Sleep(100 * time.Millisecond)
	close(stopProducing)
	n := <-produced
	require.NoError(t, err)
	marked := b.ids(t, "dispatched_at IS NOT NULL")
	require.EqualValues(t, len(marked), res.Marked)
	require.Positive(t, res.Marked)
	after := b.Count(t, "dispatched_at IS NULL")
	require.Positive(t, after, "rows committed after the cut stay pending")
	require.Equal(t, slot, res.Slot)
	require.NotZero(t, res.ReaderPID)
	require.Contains(t, res.ReaderName, "outbox-wal stream")
	require.Less(t, res.Transaction, 10*time.Second, "the snapshot is held about one status interval")
	t.Logf("%d events produced, %d marked (cut %s); caught up in %s, transaction %s (%d attempt(s)); %d progress reports",
		n, res.Marked, res.Cut, res.CatchUp.Round(time.Millisecond), res.Transaction.Round(time.Millisecond), res.Attempts, len(progress))

	// Idle now, and no heartbeat of the relay's own: the switch's message
	// moves the slot past the cut. Run again, it marks the rest.
	again, err := switchover.PrepareSwitchToPoll(ctx, b.DB.Pool, switchover.SwitchToPollConfig{Tables: b.DB.Tables, Timeout: 20 * time.Second})
	require.NoError(t, err)
	require.Equal(t, after, again.Marked)
	stopWAL()

	marked = b.ids(t, "dispatched_at IS NOT NULL")
	require.Len(t, marked, n)
	got := b.ConsumeIDs(t, len(marked), 30*time.Second, "order")
	for _, id := range marked {
		require.Contains(t, got, id, "event %d was marked dispatched, yet is not in Kafka", id)
	}
}

// to-poll refuses, marking nothing, when there is no slot, when no WAL
// relayer reads it (it would wait forever), when another process reads
// it, and when the slot does not confirm the cut in time.
func TestPrepareSwitchToPollRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("no slot", func(t *testing.T) {
		t.Parallel()
		b, slot := switchSetup(t)
		b.Emit(t, uuid.New(), "order.placed", map[string]int{"n": 1})
		_, err := switchover.PrepareSwitchToPoll(ctx, b.DB.Pool, switchover.SwitchToPollConfig{Tables: b.DB.Tables})
		require.ErrorIs(t, err, switchover.ErrNoSlot)
		require.Contains(t, err.Error(), "no replication slot "+slot)
		require.Zero(t, b.Count(t, "dispatched_at IS NOT NULL"))
	})

	t.Run("slot not streamed", func(t *testing.T) {
		t.Parallel()
		b, slot := switchSetup(t)
		_, err := switchover.SetupWAL(ctx, b.DB.Pool, b.DB.Tables, "", "")
		require.NoError(t, err)
		b.Emit(t, uuid.New(), "order.placed", map[string]int{"n": 1})
		began := time.Now()
		_, err = switchover.PrepareSwitchToPoll(ctx, b.DB.Pool, switchover.SwitchToPollConfig{Tables: b.DB.Tables, ReaderGrace: 300 * time.Millisecond})
		require.ErrorIs(t, err, switchover.ErrSlotNotStreamed)
		require.Contains(t, err.Error(), "no process has read slot "+slot)
		require.Contains(t, err.Error(), "outbox relay --mode wal")
		require.Less(t, time.Since(began), 5*time.Second, "refused after the grace, not the timeout")
		require.Zero(t, b.Count(t, "dispatched_at IS NOT NULL"))
	})

	// A WAL relayer's leader session holds the slot while it creates it
	// (which waits for open transactions): the relayer is starting, so
	// the switch waits for it rather than calling it a foreign reader.
	t.Run("relayer starting", func(t *testing.T) {
		t.Parallel()
		b, slot := switchSetup(t)
		readSlotAs(t, b, slot, "outbox-wal leader")
		b.Emit(t, uuid.New(), "order.placed", map[string]int{"n": 1})
		_, err := switchover.PrepareSwitchToPoll(ctx, b.DB.Pool, switchover.SwitchToPollConfig{Tables: b.DB.Tables, Timeout: time.Second})
		require.ErrorIs(t, err, switchover.ErrSwitchTimeout, "waited for the starting relayer until the deadline")
		require.Zero(t, b.Count(t, "dispatched_at IS NOT NULL"))
		_, err = switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, switchover.SwitchToWALConfig{Tables: b.DB.Tables})
		require.ErrorIs(t, err, switchover.ErrSlotInUse)
		require.Contains(t, err.Error(), "the WAL source already runs")
	})

	t.Run("foreign reader", func(t *testing.T) {
		t.Parallel()
		b, slot := switchSetup(t)
		readSlotAs(t, b, slot, "pg_recvlogical")
		b.Emit(t, uuid.New(), "order.placed", map[string]int{"n": 1})
		_, err := switchover.PrepareSwitchToPoll(ctx, b.DB.Pool, switchover.SwitchToPollConfig{Tables: b.DB.Tables})
		require.ErrorIs(t, err, switchover.ErrSlotNotStreamed)
		require.Contains(t, err.Error(), `"pg_recvlogical"`)
		require.Contains(t, err.Error(), "not by a WAL relayer")
		require.Zero(t, b.Count(t, "dispatched_at IS NOT NULL"))
		_, err = switchover.PrepareSwitchToWAL(ctx, b.DB.Pool, switchover.SwitchToWALConfig{Tables: b.DB.Tables})
		require.ErrorIs(t, err, switchover.ErrSlotInUse)
		require.Contains(t, err.Error(), "not a WAL relayer")
	})

	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		b, slot := switchSetup(t)
		g := &gate{Sink: b.publisher(t), open: make(chan struct{})}
		b.runWAL(t, g, nil)
		t.Cleanup(g.release) // before the relayer stops: cleanups run in reverse
		b.Emit(t, uuid.New(), "order.placed", map[string]int{"n": 1})
		_, err := switchover.PrepareSwitchToPoll(ctx, b.DB.Pool, switchover.SwitchToPollConfig{Tables: b.DB.Tables, Timeout: time.Second})
		require.ErrorIs(t, err, switchover.ErrSwitchTimeout)
		require.Contains(t, err.Error(), "slot "+slot+" did not confirm WAL position")
		require.Contains(t, err.Error(), "nothing was marked")
		require.Zero(t, b.Count(t, "dispatched_at IS NOT NULL"))

		// The broker answers again: the same call goes through.
		g.release()
		res, err := switchover.PrepareSwitchToPoll(ctx, b.DB.Pool, switchover.SwitchToPollConfig{Tables: b.DB.Tables, Timeout: time.Minute})
		require.NoError(t, err)
		require.EqualValues(t, 1, res.Marked)
		recs := kafkatest.Read(t, b.Broker.Addr(), 30*time.Second, func(rs []*kgo.Record) bool { return len(rs) >= 1 }, "order")
		require.Len(t, recs, 1)
	})
}

// WithDefaults fills each named default; config values that cannot mean
// anything are refused, by Validate and before any work.
func TestSwitchConfigsWithDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := switchover.SwitchToWALConfig{}.WithDefaults()
	require.Equal(t, outbox.Tables{}.WithDefaults(), w.Tables)
	require.Equal(t, switchover.DefaultSwitchToWALTimeout, w.Timeout)
	require.Equal(t, switchover.DefaultSwitchPollInterval, w.PollInterval)
	require.Equal(t, switchover.DefaultSwitchProgressInterval, w.ProgressInterval)
	require.Equal(t, switchover.DefaultHeldLimit, w.HeldLimit)
	require.Empty(t, w.Slot, "the slot's default is read from the database")
	require.NoError(t, w.Validate())
	p := switchover.SwitchToPollConfig{}.WithDefaults()
	require.Equal(t, outbox.Tables{}.WithDefaults(), p.Tables)
	require.Equal(t, switchover.DefaultSwitchToPollTimeout, p.Timeout)
	require.Equal(t, switchover.DefaultReaderGrace, p.ReaderGrace)
	require.Equal(t, switchover.DefaultSwitchPollInterval, p.PollInterval)
	require.Equal(t, switchover.DefaultSwitchProgressInterval, p.ProgressInterval)
	require.NoError(t, p.Validate())
	for _, tc := range []struct {
		err  error
		want string
	}{
		{switchover.SwitchToWALConfig{Tables: outbox.Tables{Outbox: "Bad-Name"}}.Validate(), "not a plain identifier"},
		{switchover.SwitchToWALConfig{Timeout: -time.Second}.Validate(), "ops: SwitchToWALConfig Timeout is -1s; use a positive duration, or 0 for the default 5m0s"},
		{switchover.SwitchToWALConfig{PollInterval: -time.Second}.Validate(), "ops: SwitchToWALConfig PollInterval is -1s"},
		{switchover.SwitchToWALConfig{ProgressInterval: -time.Second}.Validate(), "ops: SwitchToWALConfig ProgressInterval is -1s"},
		{switchover.SwitchToWALConfig{HeldLimit: -1}.Validate(), "ops: SwitchToWALConfig HeldLimit is -1; use a positive number, or 0 for the default 10"},
		{switchover.SwitchToPollConfig{Tables: outbox.Tables{Outbox: "Bad-Name"}}.Validate(), "not a plain identifier"},
		{switchover.SwitchToPollConfig{Timeout: -time.Second}.Validate(), "ops: SwitchToPollConfig Timeout is -1s; use a positive duration, or 0 for the default 2m0s"},
		{switchover.SwitchToPollConfig{ReaderGrace: -time.Second}.Validate(), "ops: SwitchToPollConfig ReaderGrace is -1s"},
		{switchover.SwitchToPollConfig{PollInterval: -time.Second}.Validate(), "ops: SwitchToPollConfig PollInterval is -1s"},
		{switchover.SwitchToPollConfig{ProgressInterval: -time.Second}.Validate(), "ops: SwitchToPollConfig ProgressInterval is -1s"},
	} {
		require.ErrorContains(t, tc.err, tc.want)
	}
	_, err := switchover.PrepareSwitchToWAL(ctx, nil, switchover.SwitchToWALConfig{Timeout: -time.Second})
	require.ErrorContains(t, err, "SwitchToWALConfig Timeout is -1s")
	_, err = switchover.PrepareSwitchToWAL(ctx, nil, switchover.SwitchToWALConfig{HeldLimit: -1})
	require.ErrorContains(t, err, "HeldLimit is -1")
	_, err = switchover.PrepareSwitchToPoll(ctx, nil, switchover.SwitchToPollConfig{ReaderGrace: -time.Second})
	require.ErrorContains(t, err, "SwitchToPollConfig ReaderGrace is -1s")
	_, err = switchover.PrepareSwitchToPoll(ctx, nil, switchover.SwitchToPollConfig{Tables: outbox.Tables{Outbox: "Bad-Name"}})
	require.ErrorContains(t, err, "not a plain identifier")
	one, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/x?pool_max_conns=1") // connects lazily: never here
	require.NoError(t, err)
	defer one.Close()
	_, err = switchover.PrepareSwitchToPoll(ctx, one, switchover.SwitchToPollConfig{})
	require.ErrorContains(t, err, "needs a pool of at least 2 connections; this one has MaxConns 1")
}

// readSlotAs sets the outbox's WAL source up and reads its slot over a
// replication connection named app (the application_name the switch
// judges a reader by), until the test ends.
func readSlotAs(t *testing.T, b *bundle, slot, app string) {
	t.Helper()
	ctx := context.Background()
	_, err := switchover.SetupWAL(ctx, b.DB.Pool, b.DB.Tables, "", "")
	require.NoError(t, err)
	cfg, err := pgconn.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	require.NoError(t, pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + slot + "'"}}))
	require.Eventually(t, func() bool {
		s, _, err := ops.ReadWALSlot(ctx, b.DB.Pool, slot)
		return err == nil && s.Active
	}, 10*time.Second, 20*time.Millisecond)
}
