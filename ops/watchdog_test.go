package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/ops"
)

// insertRow writes a row by raw SQL with the given age and, when
// dispatchedAgo >= 0, as dispatched that long ago; it returns the id.
func insertRow(t *testing.T, db *pgtest.DB, agg uuid.UUID, typ string, age, dispatchedAgo time.Duration) int64 {
	t.Helper()
	var id int64
	var dispatched *time.Duration
	if dispatchedAgo >= 0 {
		dispatched = &dispatchedAgo
	}
	err := db.Pool.QueryRow(context.Background(), `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, created_at, dispatched_at)
VALUES ($1, $2, '{}', now() - $3::bigint * interval '1 microsecond',
        CASE WHEN $4::bigint IS NULL THEN NULL ELSE now() - $4::bigint * interval '1 microsecond' END) RETURNING id`,
		agg, typ, age.Microseconds(), micros(dispatched)).Scan(&id)
	require.NoError(t, err)
	return id
}

func micros(d *time.Duration) *int64 {
	if d == nil {
		return nil
	}
	us := d.Microseconds()
	return &us
}

const pending = -1 // insertRow's dispatchedAgo for a pending row

// The watchdog lists stuck rows in id order with the failure a relayer
// recorded, names the row a stuck row waits behind, checks the lag SLO, and
// counts all stuck rows while listing at most Limit. A held row is stuck
// at once, however young; a failure older than the row's current life (it
// was replayed since) holds nothing.
func TestCheckListsStuckRowsWithTheirError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	a, b := uuid.New(), uuid.New()
	insertRow(t, db, uuid.New(), "order.placed", 20*time.Minute, 19*time.Minute)
	a1 := insertRow(t, db, a, "order.placed", 10*time.Minute, pending)
	a2 := insertRow(t, db, a, "order.paid", 9*time.Minute, pending)
	b1 := insertRow(t, db, b, "payment.captured", 8*time.Minute, pending)
	young := insertRow(t, db, uuid.New(), "order.placed", 0, pending)
	stale := insertRow(t, db, uuid.New(), "order.placed", 0, pending)

	// What relayers record: a's head failed twice (a retry after its hold
	// failed again); the young row once, just now; the stale row's failure
	// predates its created_at (replayed since), so it holds nothing.
	failedAt := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	_, err := db.Pool.Exec(ctx, "INSERT INTO "+migrate.FailuresIdent(db.Tables)+
		` (event_id, aggregate_id, type, reason, error, attempts, first_failed_at, failed_at, held_until) VALUES
		($1, $2, 'order.placed', 'too_large', 'permanent: MESSAGE_TOO_LARGE: the record is 2060 bytes', 2, $3::timestamptz - interval '1 minute', $3, now() + interval '1 hour'),
		($4, gen_random_uuid(), 'order.placed', 'undecodable', 'permanent: headers', 1, now(), now(), NULL),
		($5, gen_random_uuid(), 'order.placed', 'too_large', 'permanent: old', 1, now() - interval '1 day', now() - interval '1 day', NULL)`,
		a1, a, failedAt, young, stale)
	require.NoError(t, err)

	rep, err := ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables})
	require.NoError(t, err)
	require.False(t, rep.Healthy())
	require.True(t, rep.LagBreached)
	require.Equal(t, int64(5), rep.Pending)
	require.Equal(t, int64(4), rep.Lag.Stuck)
	require.Equal(t, int64(2), rep.Held)
	require.Equal(t, map[string]int64{"too_large": 1, "undecodable": 1}, rep.HeldByReason)
	require.InDelta(t, (2 * time.Minute).Seconds(), rep.OldestHeldAge.Seconds(), 30)
	require.InDelta(t, (10 * time.Minute).Seconds(), rep.OldestPendingAge.Seconds(), 30)
	require.Equal(t, ops.DefaultStuckAfter, rep.StuckAfter)
	require.Equal(t, ops.DefaultMaxLag, rep.MaxLag)
	require.Len(t, rep.Stuck, 4)

	s := rep.Stuck[0]
	require.Equal(t, a1, s.ID)
	require.Equal(t, a, s.AggregateID)
	require.Equal(t, "order.placed", s.Type)
	require.Zero(t, s.BlockedBy, "the head of its aggregate waits for nothing")
	require.Equal(t, "too_large", s.Reason)
	require.Equal(t, "permanent: MESSAGE_TOO_LARGE: the record is 2060 bytes", s.LastError)
	require.Equal(t, 2, s.Attempts)
	require.WithinDuration(t, failedAt, s.FailedAt, time.Millisecond)
	require.True(t, s.HeldUntil.After(time.Now()))
	require.InDelta(t, (10 * time.Minute).Seconds(), s.Age.Seconds(), 30)

	require.Equal(t, a2, rep.Stuck[1].ID)
	require.Equal(t, a1, rep.Stuck[1].BlockedBy, "a's second row waits behind its first")
	require.Empty(t, rep.Stuck[1].LastError)
	require.Equal(t, b1, rep.Stuck[2].ID)
	require.Zero(t, rep.Stuck[2].BlockedBy)
	require.Equal(t, young, rep.Stuck[3].ID, "held rows are stuck at once")
	require.Equal(t, "undecodable", rep.Stuck[3].Reason)
	require.Zero(t, rep.Stuck[3].HeldUntil, "a lifted hold")

	// Limit lists fewer, counts all; a generous threshold finds none stuck.
	rep, err = ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables, Limit: 1})
	require.NoError(t, err)
	require.Len(t, rep.Stuck, 1)
	require.Equal(t, int64(4), rep.Lag.Stuck)
	rep, err = ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables, StuckAfter: time.Hour, MaxLag: time.Hour})
	require.NoError(t, err)
	require.False(t, rep.Healthy(), "held rows keep it unhealthy whatever the threshold")
	require.Len(t, rep.Stuck, 3, "the held rows and the row behind one")
	require.Equal(t, []int64{a1, a2, young}, []int64{rep.Stuck[0].ID, rep.Stuck[1].ID, rep.Stuck[2].ID})
	_, err = db.Pool.Exec(ctx, "DELETE FROM "+migrate.FailuresIdent(db.Tables))
	require.NoError(t, err)
	rep, err = ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables, StuckAfter: time.Hour, MaxLag: time.Hour})
	require.NoError(t, err)
	require.True(t, rep.Healthy())
	require.Empty(t, rep.Stuck)

	_, err = ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables, StuckAfter: -time.Second})
	require.ErrorContains(t, err, "must not be negative")
}

func TestCheckHealthyOnEmptyOutbox(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	rep, err := ops.Check(context.Background(), db.Pool, ops.WatchdogConfig{Tables: db.Tables})
	require.NoError(t, err)
	require.True(t, rep.Healthy())
	require.Zero(t, rep.Pending)
	require.Zero(t, rep.OldestPendingAge)
}
