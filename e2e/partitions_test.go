package e2e_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// kill -9 of `outbox cleanup` while it detaches a partition of a
// partitioned outbox: its session ends with it, leaving the partition
// detach-pending (queries of the outbox no longer see its rows); the next
// `outbox cleanup` finishes the detach and drops the partition, and says
// so. Nothing else is lost: the partition kept for its pending row and the
// open one hold every row they held, and no detached table is left over.
func TestCleanupKilledMidDetachLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4, Partitioned: true, PartitionWidth: 100, PartitionedIDs: 1000})
	ob := db.Tables.OutboxIdent()
	_, err := db.Pool.Exec(ctx, "INSERT INTO "+ob+` (aggregate_id, type, payload, created_at, dispatched_at)
		SELECT gen_random_uuid(), 'order.placed', '{}', now() - interval '10 days', now() - interval '10 days' FROM generate_series(1, 350)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "UPDATE "+ob+" SET dispatched_at = NULL WHERE id = 150")
	require.NoError(t, err)
	flags := []string{"--database-url", db.URL, "--schema", db.Tables.Schema, "--retention", "1d", "--processed-retention", "0"}

	// A transaction reading the outbox: the detach waits for it.
	reader, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer reader.Rollback(ctx) //nolint:errcheck // ended below
	_, err = reader.Exec(ctx, "SELECT count(*) FROM "+ob)
	require.NoError(t, err)

	detaching := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE 'ALTER TABLE %DETACH PARTITION%CONCURRENTLY' AND query LIKE '%'||$1||'%'`, db.Tables.Schema).Scan(&n))
		return n
	}
	p := start(t, append([]string{"cleanup"}, flags...)...)
	require.Eventually(t, func() bool { return detaching() > 0 }, 60*time.Second, 10*time.Millisecond, "cleanup never detached; output:\n%s", p.out.String())
	p.signal(t, syscall.SIGKILL)
	p.wait(t, 10*time.Second)
	require.Eventually(t, func() bool { return detaching() == 0 }, 30*time.Second, 50*time.Millisecond, "the killed cleanup's DETACH went on without it")
	require.NoError(t, reader.Rollback(ctx))
	ps, err := partition.List(ctx, db.Pool, ob)
	require.NoError(t, err)
	require.True(t, ps[0].DetachPending, "%+v", ps[0])

	again := start(t, append([]string{"cleanup"}, flags...)...)
	require.Equal(t, 0, again.wait(t, 60*time.Second), again.out.String())
	out := again.out.String()
	require.Contains(t, out, "finishing the detach of a partition that an earlier cleanup began and did not finish")
	require.Contains(t, out, "finished what an earlier cleanup left half done: "+ps[0].Name)
	require.Contains(t, out, "dropped 2 partitions")
	require.Contains(t, out, "kept "+db.Tables.Outbox+"_p0000000000000000100 (ids 100-199): 1 pending rows")

	var kept, open int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE id < 200), count(*) FILTER (WHERE id >= 300) FROM "+ob).Scan(&kept, &open))
	require.Equal(t, 100, kept, "the kept partition's rows")
	require.Equal(t, 51, open, "the open partition's rows")
	var leftover []string
	rows, err := db.Pool.Query(ctx, `SELECT relname::text FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind = 'r' AND relname LIKE '%\_p0%' AND NOT relispartition`, db.Tables.Schema)
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		leftover = append(leftover, n)
	}
	require.NoError(t, rows.Err())
	require.Empty(t, leftover, "no detached partition left over")
	require.False(t, strings.Contains(out, "ERROR"), out)
}
