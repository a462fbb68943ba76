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

func TestReadStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	// In creation order, as a real outbox is: old history, then the last
	// hour's, then the last minutes'.
	for range 5 {
		insertRow(t, db, uuid.New(), "order.placed", 3*time.Hour, 2*time.Hour) // outside both windows
	}
	var doneID int64
	for range 4 {
		doneID = insertRow(t, db, uuid.New(), "order.placed", 50*time.Minute, 40*time.Minute) // last hour
	}
	stuck := insertRow(t, db, uuid.New(), "order.placed", 10*time.Minute, pending)
	for range 3 {
		insertRow(t, db, uuid.New(), "order.placed", 2*time.Minute, 30*time.Second) // last minute
	}
	insertRow(t, db, uuid.New(), "order.placed", 0, pending)
	_, err := db.Pool.Exec(ctx, "INSERT INTO "+migrate.FailuresIdent(db.Tables)+
		" (event_id, aggregate_id, type, error, first_failed_at, failed_at) VALUES ($1, gen_random_uuid(), 'order.placed', 'x', now(), now()), ($2, gen_random_uuid(), 'order.placed', 'x', now(), now())",
		stuck, doneID)
	require.NoError(t, err)

	s, err := ops.ReadStats(ctx, db.Pool, ops.StatsConfig{Tables: db.Tables, StuckAfter: 5 * time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(2), s.Pending)
	require.Equal(t, int64(1), s.Stuck)
	require.Equal(t, 5*time.Minute, s.StuckAfter)
	require.InDelta(t, (10 * time.Minute).Seconds(), s.OldestPendingAge.Seconds(), 30)
	require.Equal(t, int64(1), s.Held, "only the pending row's failure counts")
	require.Equal(t, map[string]int64{"broker_refused": 1}, s.HeldByReason)
	require.Positive(t, s.OldestHeldAge)
	require.Equal(t, int64(3), s.DispatchedLastMinute)
	require.Equal(t, int64(7), s.DispatchedLastHour)
	require.Positive(t, s.TableBytes)
	require.GreaterOrEqual(t, s.LiveRows, int64(0))

	// Nothing pending: no lag.
	_, err = db.Pool.Exec(ctx, "UPDATE "+db.Tables.OutboxIdent()+" SET dispatched_at = now() WHERE dispatched_at IS NULL")
	require.NoError(t, err)
	s, err = ops.ReadStats(ctx, db.Pool, ops.StatsConfig{Tables: db.Tables, StuckAfter: 5 * time.Minute})
	require.NoError(t, err)
	require.Zero(t, s.Pending)
	require.Zero(t, s.OldestPendingAge)
	require.Equal(t, int64(5), s.DispatchedLastMinute)
}

func TestReadStatsEmptyTable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	s, err := ops.ReadStats(context.Background(), db.Pool, ops.StatsConfig{Tables: db.Tables, StuckAfter: time.Minute})
	require.NoError(t, err)
	require.Zero(t, s.Pending)
	require.Zero(t, s.DispatchedLastHour)
	require.Positive(t, s.TableBytes, "an empty table still has its index pages")
}
