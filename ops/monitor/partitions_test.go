package monitor_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/ops/monitor"
)

// A monitor of a partitioned outbox makes its partitions ahead without
// the cleanup job, serves the headroom and the partitions the last
// retention run kept; a plain outbox's serves none of it.
func TestMonitorKeepsPartitionsAheadAndServesTheirMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6, Partitioned: true, PartitionWidth: 100, PartitionedIDs: 1})
	b := &bundle{&opstest.Bundle{DB: db}}
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	_, err = m.EnablePartitioned(ctx, db.Pool, migrate.PartitionSettings{Ahead: time.Hour}) // a headroom of an hour's rate
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload, created_at, dispatched_at) SELECT gen_random_uuid(), 'order.placed', '{}', now() - interval '9 days', now() FROM generate_series(1, 250)")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "UPDATE "+db.Tables.OutboxIdent()+" SET dispatched_at = NULL WHERE id = 50")
	require.NoError(t, err)
	_, err = ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, Retention: 24 * time.Hour, SkipProcessed: true})
	require.NoError(t, err)
	// Ids up to 450: the partitions the cleanup made ahead reach 500.
	_, err = db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) SELECT gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, 200)")
	require.NoError(t, err)

	mon := b.monitor(t, func(c *monitor.Config) { c.PartitionInterval = 50 * time.Millisecond })
	srv := httptest.NewServer(mon.Handler())
	defer srv.Close()
	stop := opstest.Start(t, mon.Run)
	defer stop()
	require.Eventually(t, func() bool {
		m, err := tryScrape(srv.URL)
		return err == nil && m.val("outbox_partition_headroom_ids") >= 200 && m.val("outbox_partitions_kept", "reason", "pending") == 1
	}, 10*time.Second, 50*time.Millisecond)
	sc := scrape(t, srv.URL)
	require.Equal(t, 0.0, sc.must(t, "outbox_partition_headroom_low"))
	require.GreaterOrEqual(t, sc.must(t, "outbox_partitions"), 3.0)
	require.GreaterOrEqual(t, sc.must(t, "outbox_partitions_created_total"), 1.0, "the monitor made the partitions the 200 ids left missing")

	plain := setup(t)
	pm := plain.monitor(t, nil)
	pm.KeepPartitions(ctx)
	rec := httptest.NewRecorder()
	pm.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.NotContains(t, rec.Body.String(), "outbox_partition", "a plain outbox has no partitions to report")
}
