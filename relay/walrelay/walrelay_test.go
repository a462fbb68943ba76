package walrelay_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// emitMany writes n events per aggregate from one goroutine per aggregate,
// alternating outbox.Emit and a plain INSERT, one event per transaction,
// and returns their ids.
func (b *bundle) emitMany(t *testing.T, aggs []uuid.UUID, n int) map[int64]bool {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	ids := map[int64]bool{}
	var wg sync.WaitGroup
	for _, agg := range aggs {
		wg.Go(func() {
			for i := range n {
				var id int64
				err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					if i%2 == 0 {
						evID, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed",
							Payload: map[string]int{"n": i}, Headers: map[string]string{"trace": fmt.Sprint(i)}})
						id = evID
						return err
					}
					return tx.QueryRow(ctx, `INSERT INTO `+b.db.Tables.OutboxIdent()+` (aggregate_id, type, payload, headers)
						VALUES ($1, 'order.paid', $2, $3) RETURNING id`, agg, fmt.Sprintf(`{"n": %d}`, i), fmt.Sprintf(`{"trace": "%d"}`, i)).Scan(&id)
				})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids[id] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ids
}

func aggregates(n int) []uuid.UUID {
	out := make([]uuid.UUID, n)
	for i := range out {
		out[i] = uuid.New()
	}
	return out
}

// Events written with Emit and with plain INSERTs, from many aggregates,
// come out in per-aggregate order, keyed by aggregate, with the polling
// relay's headers; the table is never updated.
func TestStreamsInsertsInOrderWithHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relayer(t, nil)
	run(t, r)
	waitLeading(t, r)
	aggs := aggregates(20)
	ids := b.emitMany(t, aggs, 30)
	recs := kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeast(len(ids)), "order")
	require.Zero(t, checkOrder(t, recs, ids), "no duplicates without a restart")
	for _, rec := range recs {
		h := kafkatest.Headers(rec)
		_, err := uuid.ParseBytes(rec.Key)
		require.NoError(t, err, "key is the aggregate id")
		require.Contains(t, []string{"order.placed", "order.paid"}, h[outbox.HeaderEventType])
		require.Equal(t, outbox.ContentTypeJSON, h[outbox.HeaderContentType])
		require.Equal(t, "wal", h[outbox.HeaderEventSource])
		require.NotEmpty(t, h["trace"], "the row's own headers")
		require.Contains(t, string(rec.Value), `"n": `)
	}
	var dispatched int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.db.Tables.OutboxIdent()+` WHERE dispatched_at IS NOT NULL`).Scan(&dispatched))
	require.Zero(t, dispatched, "the WAL source never updates a row")
	require.Eventually(t, func() bool {
		l, err := walrelay.Lag(context.Background(), b.db.Pool, b.slot)
		require.NoError(t, err)
		return l.Bytes < 64<<10 && r.Lag() == 0
	}, 10*time.Second, 50*time.Millisecond, "the slot catches up once the broker has everything")
}

// The other two emit modes: insert and delete in one transaction, and a
// transactional logical message carrying the event.
func TestInsertDeleteAndLogicalMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relayer(t, nil)
	run(t, r)
	waitLeading(t, r)
	ctx := context.Background()
	agg := uuid.New()
	var want []int64
	for i := range 10 {
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var id int64
			if i%2 == 0 {
				evID, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]int{"n": i}})
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `DELETE FROM `+b.db.Tables.OutboxIdent()+` WHERE id = $1`, evID)
				want = append(want, evID)
				return err
			}
			err := tx.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence($1, 'id'))`, b.db.Tables.OutboxIdent()).Scan(&id)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, json_build_object('id', $2::bigint, 'aggregate_id', $3::uuid,
				'type', 'order.noted', 'payload', $4::jsonb, 'headers', '{"via": "message"}'::jsonb)::text)`,
				walrelay.MessagePrefix(b.db.Tables), id, agg, fmt.Sprintf(`{"n": %d}`, i))
			want = append(want, id)
			return err
		})
		require.NoError(t, err)
	}
	// A rolled-back message is never published.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, '{"id": 999999, "aggregate_id": "`+agg.String()+`", "type": "order.rolled", "payload": {}}')`, walrelay.MessagePrefix(b.db.Tables))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeastThenQuiet(len(want), 500*time.Millisecond), "order")
	var got []int64
	for _, rec := range recs {
		got = append(got, kafkatest.EventID(rec))
		if kafkatest.Headers(rec)[outbox.HeaderEventType] == "order.noted" {
			require.Equal(t, "message", kafkatest.Headers(rec)["via"])
		}
	}
	require.Equal(t, want, got, "every event once, in commit order, the rolled-back one never")
	var rows int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.db.Tables.OutboxIdent()).Scan(&rows))
	require.Zero(t, rows)
}

// A relayer cancelled mid-stream and a new one started lose nothing; the
// new one re-sends at most what the first had not acknowledged.
func TestRestartMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The slot exists before the first event: what came before it is not
	// in it.
	require.NoError(t, walrelay.Setup(context.Background(), b.db.Pool, b.db.Tables, b.slot, b.slot))
	aggs := aggregates(10)
	var (
		ids  = map[int64]bool{}
		mu   sync.Mutex
		wg   sync.WaitGroup
		done = make(chan struct{})
	)
	wg.Go(func() {
		defer close(done)
		for range 6 {
			got := b.emitMany(t, aggs, 20)
			mu.Lock()
			for id := range got {
				ids[id] = true
			}
			mu.Unlock()
		}
	})
	for i := 0; ; i++ {
		r := b.relayer(t, nil)
		stop := run(t, r)
		// Stopped once it streams: a stop while Run is still starting is
		// the conformance suite's StopWhileStarting, not this test's
		// concern.
		waitLeading(t, r)
		select {
		case <-done:
		case <-time.After(300 * time.Millisecond):
		}
		stop()
		select {
		case <-done:
		default:
			continue
		}
		if i > 0 {
			break
		}
	}
	wg.Wait()
	r := b.relayer(t, nil)
	run(t, r)
	recs := kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeastThenQuiet(len(ids), time.Second), "order")
	dups := checkOrder(t, recs, ids)
	t.Logf("%d events, %d duplicates after the restarts", len(ids), dups)
}

// Killing the leader's sessions (as kill -9 of its process would end them)
// hands the slot to a standby within seconds, without loss.
func TestFailoverToStandby(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.relayer(t, func(c *walrelay.Config) { c.Name = "a"; c.BackoffMin, c.BackoffMax = 2*time.Second, 3*time.Second })
	run(t, a)
	waitLeading(t, a)
	s := b.relayer(t, func(c *walrelay.Config) { c.Name = "b" })
	run(t, s)
	aggs := aggregates(5)
	ids := b.emitMany(t, aggs, 10)
	kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeast(len(ids)), "order")
	require.False(t, s.Stats().Leading)

	ctx := context.Background()
	var killed int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'outbox-wal % a'`).Scan(&killed))
	require.Equal(t, 2, killed, "the leader's lock session and its stream")
	killedAt := time.Now()
	more := b.emitMany(t, aggs, 10)
	waitLeading(t, s)
	t.Logf("standby took over %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	for id := range more {
		ids[id] = true
	}
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeastThenQuiet(len(ids), 500*time.Millisecond), "order")
	checkOrder(t, recs, ids)
	require.False(t, a.Stats().Leading, "the old leader stands by")
}

// The machine's server has wal_level=replica: one clear error, not a retry
// loop.
func TestReplicaWALLevelIsAClearError(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var level string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SHOW wal_level`).Scan(&level))
	if level == "logical" {
		t.Skip("skipped: the default server has wal_level=logical; this test needs one without")
	}
	r, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: db.Pool, Sink: nopPublisher{}, Tables: db.Tables}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorIs(t, err, walrelay.ErrWALLevel)
	require.NotContains(t, err.Error(), "\n")
	require.Contains(t, err.Error(), "wal_level = logical")
	require.Contains(t, err.Error(), "--mode poll")
}

// With the outbox idle and another table churning, the heartbeat alone
// (keepalives do not move the slot here) keeps the slot's lag bounded.
func TestHeartbeatAdvancesSlotWhileOtherTableChurns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relayer(t, func(c *walrelay.Config) { c.HeartbeatInterval = 200 * time.Millisecond })
	walrelay.NoKeepaliveAdvance(r)
	run(t, r)
	waitLeading(t, r)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `CREATE TABLE churn (id bigserial PRIMARY KEY, pad text)`)
	require.NoError(t, err)
	start := r.Stats().AckedLSN
	var written int64
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO churn (pad) SELECT repeat('x', 200) FROM generate_series(1, 500)`)
		require.NoError(t, err)
		written++
	}
	require.Eventually(t, func() bool {
		l, err := walrelay.Lag(ctx, b.db.Pool, b.slot)
		require.NoError(t, err)
		return l.Bytes < 1<<20
	}, 5*time.Second, 50*time.Millisecond, "the slot follows the WAL while the outbox is idle")
	st := r.Stats()
	require.Positive(t, st.Heartbeats)
	require.Greater(t, st.AckedLSN, start)
	require.Zero(t, st.Dispatched)
	t.Logf("%d churn statements, %d heartbeats, slot from %#x to %#x", written, st.Heartbeats, start, st.AckedLSN)
}

// A record the broker refuses for good (here: headers the relayer sets
// itself, written by hand before migration 6) is parked and the stream goes on.
func TestPoisonEventIsParkedAndStreamGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relayer(t, nil)
	run(t, r)
	waitLeading(t, r)
	ctx := context.Background()
	agg := uuid.New()
	ins := `INSERT INTO ` + b.db.Tables.OutboxIdent() + ` (aggregate_id, type, payload, headers) VALUES ($1, $2, '{}', $3) RETURNING id`
	var bad, good1, good2 int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, ins, agg, "order.placed", nil).Scan(&good1))
	// Migration 6 refuses such a row at INSERT: it is one written before.
	b.db.WriteLegacy(t, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, ins, agg, "order.placed", `{"event_id": "forged"}`).Scan(&bad)
	})
	require.NoError(t, b.db.Pool.QueryRow(ctx, ins, agg, "order.placed", nil).Scan(&good2))
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeastThenQuiet(2, 500*time.Millisecond), "order")
	require.Len(t, recs, 2)
	require.Equal(t, []int64{good1, good2}, []int64{kafkatest.EventID(recs[0]), kafkatest.EventID(recs[1])})
	// Parking follows the publish of its batch: wait for it.
	var reason string
	require.Eventually(t, func() bool { return r.Stats().Parked == 1 }, 5*time.Second, 10*time.Millisecond, "parked: %d", r.Stats().Parked)
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT reason FROM `+migrate.ParkedIdent(b.db.Tables)+` WHERE id = $1`, bad).Scan(&reason))
	require.Equal(t, "wal relay: reserved_header", reason)
}

// A second reader of the slot that is not a relayer: a clear error.
func TestSlotReadByAnotherProcessIsAClearError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.holdSlot(t, "")
	r := b.relayer(t, func(c *walrelay.Config) { c.SlotBusyTimeout = 300 * time.Millisecond })
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := r.Run(rctx)
	require.ErrorIs(t, err, walrelay.ErrSlotBusy)
	require.Contains(t, err.Error(), "pg_terminate_backend")
}

// An invalidated slot (it fell behind max_slot_wal_keep_size): a clear
// error. Its own cluster, since the setting is server-wide.
func TestLostSlotIsAClearError(t *testing.T) {
	t.Parallel()
	needLogical(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := tmppg.Logical(ctx, 4, map[string]string{"max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB", "min_wal_size": "32MB"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	db := pgtest.New(t, pgtest.Options{ServerURL: c.URL()})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	require.NoError(t, walrelay.Setup(ctx, db.Pool, db.Tables, slot, slot))
	_, err = db.Pool.Exec(ctx, `CREATE TABLE filler (pad text)`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := db.Pool.Exec(ctx, `INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 5000)`)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `SELECT pg_switch_wal()`)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `CHECKPOINT`)
		require.NoError(t, err)
		l, err := walrelay.Lag(ctx, db.Pool, slot)
		require.NoError(t, err)
		return l.WALStatus == "lost"
	}, 60*time.Second, 10*time.Millisecond, "the slot is never invalidated")
	r, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: db.Pool, Sink: nopPublisher{}, Tables: db.Tables}})
	require.NoError(t, err)
	err = r.Run(ctx)
	require.ErrorIs(t, err, walrelay.ErrSlotLost)
	require.NotContains(t, err.Error(), "\n")
	require.True(t, strings.Contains(err.Error(), "--teardown"), err.Error())
}

type nopPublisher struct{ fakesink.Kafka }

func (nopPublisher) Publish(_ context.Context, msgs []relay.Message) []error {
	return make([]error, len(msgs))
}

// refusingPublisher fails every message with a transient error, keeping
// the stream's events unacknowledged.
type refusingPublisher struct {
	fakesink.Kafka
	calls atomic.Int64
}

func (p *refusingPublisher) Publish(_ context.Context, msgs []relay.Message) []error {
	p.calls.Add(1)
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = errors.New("broker unavailable (test)")
	}
	return errs
}

// A non-transactional message logged inside a transaction lands between
// its inserts and its commit record (a heartbeat from another session does
// so under load). Decoded before the transaction, it may be confirmed at
// once, but only up to its own end, where the commit record starts: one
// byte further and a relayer that restarts before the transaction was
// acknowledged never sees it again.
func TestMessageBeforeACommitDoesNotSkipItsTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	refusing := &refusingPublisher{}
	r1 := b.relayer(t, func(c *walrelay.Config) { c.Sink = refusing })
	stop1 := run(t, r1)
	waitLeading(t, r1)

	var id int64
	var msgLSN string
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO `+b.db.Tables.OutboxIdent()+` (aggregate_id, type, payload) VALUES ($1, 'order.placed', '{}') RETURNING id`, uuid.New()).Scan(&id); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT pg_logical_emit_message(false, $1, '')::text`, walrelay.HeartbeatPrefix).Scan(&msgLSN)
	}))
	require.Eventually(t, func() bool {
		var confirmed bool
		err := b.db.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2`, msgLSN, b.slot).Scan(&confirmed)
		return err == nil && confirmed
	}, 20*time.Second, 20*time.Millisecond, "the slot never confirmed the message")
	require.Eventually(t, func() bool { return refusing.calls.Load() > 0 }, 20*time.Second, 20*time.Millisecond, "the transaction never reached the publisher")
	stop1()

	run(t, b.relayer(t, nil))
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeastThenQuiet(1, 500*time.Millisecond), "order")
	require.Len(t, recs, 1, "the transaction after the message was skipped")
	require.Equal(t, id, kafkatest.EventID(recs[0]))
}
