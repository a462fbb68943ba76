package ops_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay"
)

// fill inserts n rows at once (generate_series): created `age` ago,
// dispatched `dispatchedAgo` ago (pending when negative), every
// pendingEvery-th one pending instead (0: none).
func fill(t *testing.T, db *pgtest.DB, n int, age, dispatchedAgo time.Duration, pendingEvery int) {
	t.Helper()
	var dispatched *time.Duration
	if dispatchedAgo >= 0 {
		dispatched = &dispatchedAgo
	}
	_, err := db.Pool.Exec(context.Background(), `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, created_at, dispatched_at)
SELECT gen_random_uuid(), 'order.placed', '{"n": 1}', now() - $2::bigint * interval '1 microsecond',
  CASE WHEN $3::bigint IS NULL OR ($4 > 0 AND i % $4 = 0) THEN NULL ELSE now() - $3::bigint * interval '1 microsecond' END
FROM generate_series(1, $1) AS i`, n, age.Microseconds(), micros(dispatched), pendingEvery)
	require.NoError(t, err)
}

func (b *bundle) countProcessed(t *testing.T) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.DB.Tables.ProcessedIdent()).Scan(&n))
	return n
}

// Cleanup deletes exactly the dispatched rows past the retention, in
// windows that stop where the recent rows begin, and the dedupe rows past
// theirs; pending rows (old ones included), recently dispatched rows and
// the failure records of pending rows stay.
func TestCleanupDeletesOnlyOldDispatchedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	b := &bundle{&opstest.Bundle{DB: db}}
	day := 24 * time.Hour
	fill(t, db, 2500, 10*day, 10*day, 100)    // 2475 old dispatched, 25 old pending
	fill(t, db, 100, 10*day, time.Hour, 0)    // old, but dispatched within the retention
	fill(t, db, 300, time.Hour, time.Hour, 0) // recent
	fill(t, db, 10, time.Minute, pending, 0)  // recent pending
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Tables.ProcessedIdent()+` (consumer, source, event_id, processed_at)
SELECT 'loyalty', '', i, now() - CASE WHEN i <= 1500 THEN interval '40 days' ELSE interval '1 day' END FROM generate_series(1, 1700) AS i`)
	require.NoError(t, err)
	var oldPending, dispatchedID int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT min(id) FILTER (WHERE dispatched_at IS NULL), min(id) FILTER (WHERE dispatched_at IS NOT NULL) FROM "+db.Tables.OutboxIdent()).Scan(&oldPending, &dispatchedID))
	_, err = db.Pool.Exec(ctx, "INSERT INTO "+migrate.FailuresIdent(db.Tables)+
		" (event_id, aggregate_id, type, error, first_failed_at, failed_at) VALUES ($1, gen_random_uuid(), 't', 'x', now(), now()), ($2, gen_random_uuid(), 't', 'x', now(), now())",
		oldPending, dispatchedID)
	require.NoError(t, err)
	pendingBefore := b.Count(t, "dispatched_at IS NULL")
	require.Equal(t, int64(35), pendingBefore)

	cfg := ops.CleanupConfig{Tables: db.Tables, BatchSize: 1000, Pause: time.Millisecond, Logger: opstest.Logger(t)}
	res, err := ops.Cleanup(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Equal(t, int64(2475), res.Outbox.Deleted)
	// Windows of 1000 rows: 1-1000, 1001-2000, then 2001-3000, which
	// reaches the rows created within the retention and ends the walk.
	require.Equal(t, 3, res.Outbox.Batches)
	require.Equal(t, int64(1500), res.Processed.Deleted)
	require.Equal(t, 2, res.Processed.Batches)
	require.Equal(t, int64(1), res.Failures)
	require.WithinDuration(t, time.Now().Add(-ops.DefaultRetention), res.OutboxCutoff, time.Minute)
	require.WithinDuration(t, time.Now().Add(-ops.DefaultProcessedRetention), res.ProcessedCutoff, time.Minute)

	require.Equal(t, pendingBefore, b.Count(t, "dispatched_at IS NULL"), "no pending row deleted")
	require.Equal(t, int64(400), b.Count(t, "dispatched_at IS NOT NULL"))
	require.Zero(t, b.Count(t, "dispatched_at < now() - interval '7 days'"))
	require.Equal(t, int64(200), b.countProcessed(t))
	var failures []int64
	rows, err := db.Pool.Query(ctx, "SELECT event_id FROM "+migrate.FailuresIdent(db.Tables))
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		failures = append(failures, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{oldPending}, failures)

	// A second run finds nothing; SkipProcessed leaves the dedupe rows.
	cfg.Retention, cfg.ProcessedRetention, cfg.SkipProcessed = time.Minute, time.Hour, true
	res, err = ops.Cleanup(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Equal(t, int64(400), res.Outbox.Deleted, "a 1m retention takes every dispatched row")
	require.Zero(t, res.Processed.Batches)
	require.Equal(t, int64(200), b.countProcessed(t))
	require.Equal(t, pendingBefore, b.Count(t, "dispatched_at IS NULL"))

	_, err = ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, BatchSize: -1})
	require.ErrorContains(t, err, "BatchSize is -1")
}

// One cleanup per outbox at a time: a second one returns
// ErrCleanupRunning, and the lock goes when the first ends, even
// cancelled.
func TestCleanupRunsOneAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	fill(t, db, 50, 30*24*time.Hour, 30*24*time.Hour, 0)

	// A slow cleanup: one row a batch, a second between batches.
	slowCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	slow := make(chan error, 1)
	go func() {
		_, err := ops.Cleanup(slowCtx, db.Pool, ops.CleanupConfig{Tables: db.Tables, BatchSize: 1, Pause: time.Second})
		slow <- err
	}()
	// Wait until the slow one holds the lock (it has deleted a row), so
	// the probe below cannot be the one that takes it.
	b := &bundle{&opstest.Bundle{DB: db}}
	require.Eventually(t, func() bool { return b.Count(t, "true") < 50 }, 10*time.Second, 20*time.Millisecond, "the slow cleanup never started")
	probeCtx, probeCancel := context.WithTimeout(ctx, 10*time.Second)
	defer probeCancel()
	_, err := ops.Cleanup(probeCtx, db.Pool, ops.CleanupConfig{Tables: db.Tables, BatchSize: 1, Pause: time.Hour})
	require.ErrorIs(t, err, ops.ErrCleanupRunning, "a second cleanup ran beside the first")

	cancel()
	select {
	case err := <-slow:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled cleanup did not return")
	}
	res, err := ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, BatchSize: 1000})
	require.NoError(t, err, "the lock was not released")
	require.Positive(t, res.Outbox.Deleted)
}

// Cleanup with a retention of a millisecond, over and over, beside a relay
// under load: it deletes rows right behind the relay, and yet every
// emitted event reaches Kafka: no pending row is ever deleted.
func TestCleanupConcurrentWithRelayUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cl := b.Client(t)
	r, err := relay.New(b.RelayConfig(t, cl))
	require.NoError(t, err)
	opstest.RunRelayer(t, r)

	var deleted, runs atomic.Int64
	stopCleanup := opstest.Start(t, func(ctx context.Context) {
		for ctx.Err() == nil {
			res, err := ops.Cleanup(ctx, b.DB.Pool, ops.CleanupConfig{Tables: b.DB.Tables, Retention: time.Millisecond,
				SkipProcessed: true, BatchSize: 100, Pause: time.Millisecond})
			if err != nil && ctx.Err() == nil {
				t.Errorf("cleanup: %v", err)
				return
			}
			deleted.Add(res.Outbox.Deleted)
			runs.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	})

	const emitters, each = 4, 300
	var wg sync.WaitGroup
	ids := make([][]int64, emitters)
	for e := range emitters {
		wg.Go(func() {
			agg := uuid.New()
			for i := range each {
				if i%30 == 0 {
					agg = uuid.New()
				}
				var id int64
				err := pgx.BeginFunc(context.Background(), b.DB.Pool, func(tx pgx.Tx) error {
					var err error
					id, err = b.Producer.Emit(context.Background(), tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]int{"n": i}})
					return err
				})
				if err != nil {
					t.Errorf("emit: %v", err)
					return
				}
				ids[e] = append(ids[e], id)
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return r.Stats().Dispatched >= emitters*each }, 30*time.Second, 20*time.Millisecond)
	stopCleanup()

	seen := b.ConsumeIDs(t, emitters*each, 30*time.Second, "order")
	for _, batch := range ids {
		for _, id := range batch {
			require.Contains(t, seen, id, "event %d never reached Kafka", id)
		}
	}
	require.Equal(t, int64(emitters*each), r.Stats().Dispatched, "the relay published each event once")
	require.Positive(t, deleted.Load(), "cleanup deleted nothing: the test proved nothing")
	t.Logf("%d events emitted and published; %d cleanup runs deleted %d dispatched rows meanwhile", emitters*each, runs.Load(), deleted.Load())
}
