package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/ops"
)

// partitionedDB is a test's outbox in the partitioned layout with
// partitions of width ids, made for the first 20 widths.
func partitionedDB(t *testing.T, width int64) *pgtest.DB {
	t.Helper()
	return pgtest.New(t, pgtest.Options{MaxConns: 6, Partitioned: true, PartitionWidth: width, PartitionedIDs: 20 * width})
}

func partitionNames(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	ps, err := partition.List(context.Background(), db.Pool, db.Tables.OutboxIdent())
	require.NoError(t, err)
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func exec(t *testing.T, db *pgtest.DB, sql string, args ...any) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
}

// Retention drops the partitions whose rows are all dispatched and older
// than the retention, and only those: one with a pending row, one with a
// held row and one with a parked row's id are kept and reported (in the
// result, the recorded run, the watchdog's problems), young and open ones
// are not due.
func TestPartitionRetentionDropsOnlyDispatchedOldPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := partitionedDB(t, 100)
	day := 24 * time.Hour
	fill(t, db, 549, 10*day, 10*day, 0)       // ids 1-549, in partitions p0 to p500: old and dispatched
	fill(t, db, 100, time.Hour, time.Hour, 0) // ids 550-649: young
	ob := db.Tables.OutboxIdent()
	exec(t, db, "UPDATE "+ob+" SET dispatched_at = NULL WHERE id = 150")         // p100: pending
	exec(t, db, "UPDATE "+ob+" SET dispatched_at = NULL WHERE id IN (250, 260)") // p200: held
	exec(t, db, `INSERT INTO `+db.Tables.Schema+`.events_outbox_failures (event_id, aggregate_id, type, reason, error, first_failed_at, failed_at, held_until)
		SELECT id, aggregate_id, type, 'too_large', 'too big', now(), now(), now() + interval '1 hour' FROM `+ob+` WHERE id = 250`)
	exec(t, db, `WITH moved AS (DELETE FROM `+ob+` WHERE id = 350 RETURNING *)
		INSERT INTO `+db.Tables.Schema+`.events_outbox_parked (id, aggregate_id, type, payload, created_at, reason)
		SELECT id, aggregate_id, type, payload, created_at, 'test' FROM moved`) // p300: a parked id

	infos, h, err := ops.ListPartitions(ctx, db.Pool, ops.PartitionListConfig{Tables: db.Tables, Retention: day})
	require.NoError(t, err)
	require.Equal(t, int64(650), h.NextID)
	why := map[int64]string{}
	for _, in := range infos {
		why[in.From] = in.Reason
		if in.Droppable {
			why[in.From] = "droppable"
		}
	}
	require.Equal(t, map[int64]string{0: "droppable", 100: ops.KeptPending, 200: ops.KeptHeld, 300: ops.KeptParked, 400: "droppable", 500: "", 600: ""},
		subset(why, 0, 100, 200, 300, 400, 500, 600), "p500 holds young rows, p600 is open")

	res, err := ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, Retention: day, SkipProcessed: true})
	require.NoError(t, err)
	require.NotNil(t, res.Partitions)
	var dropped []int64
	for _, d := range res.Partitions.Dropped {
		dropped = append(dropped, d.From)
	}
	require.Equal(t, []int64{0, 400}, dropped)
	kept := map[int64]string{}
	for _, k := range res.Partitions.Kept {
		kept[k.From] = k.Reason
	}
	require.Equal(t, map[int64]string{100: ops.KeptPending, 200: ops.KeptHeld, 300: ops.KeptParked}, kept)
	require.Zero(t, res.Outbox.Deleted, "no row is deleted one by one")

	var left, pending int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE dispatched_at IS NULL) FROM "+ob).Scan(&left, &pending))
	require.Equal(t, 649-200, left, "the rows of p0 (99) and p400 (100) are gone, and id 350 is parked")
	require.Equal(t, 3, pending)
	require.NotContains(t, partitionNames(t, db), db.Tables.Outbox+"_p0000000000000000000")

	st, err := ops.ReadPartitionStatus(ctx, db.Pool, db.Tables)
	require.NoError(t, err)
	require.NotNil(t, st.LastRetention)
	require.Len(t, st.LastRetention.Kept, 3)
	require.Len(t, st.Problems(), 2, "the pending and held partitions are problems, the parked one is not: %v", st.Problems())
	rep, err := ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables})
	require.NoError(t, err)
	require.False(t, rep.Healthy())
}

func subset(m map[int64]string, keys ...int64) map[int64]string {
	out := map[int64]string{}
	for _, k := range keys {
		out[k] = m[k]
	}
	return out
}
