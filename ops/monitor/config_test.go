package monitor_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/ops/monitor"
)

func TestConfigWithDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/x") // connects lazily: never here
	require.NoError(t, err)
	defer pool.Close()

	tables := outbox.Tables{Schema: "s"}
	d := monitor.Config{Pool: pool, Tables: tables, Source: ops.WAL("slot_x")}.WithDefaults()
	require.Equal(t, tables.WithDefaults(), d.Tables)
	require.Equal(t, monitor.DefaultRefreshInterval, d.RefreshInterval)
	require.Equal(t, monitor.DefaultWatchdogInterval, d.WatchdogInterval)
	require.Equal(t, monitor.DefaultCleanupInterval, d.CleanupInterval)
	require.Equal(t, monitor.DefaultCheckTimeout, d.CheckTimeout)
	require.NotNil(t, d.Logger)
	require.Equal(t, d.Tables, d.Watchdog.Tables)
	require.Equal(t, d.Source, d.Watchdog.Source)
	require.Equal(t, ops.DefaultMaxLag, d.Watchdog.MaxLag)
	require.Positive(t, d.Watchdog.Limit)
	require.Equal(t, d.Tables, d.Cleanup.Tables)
	require.Equal(t, d.Source, d.Cleanup.Source)
	require.Same(t, d.Logger, d.Cleanup.Logger)
	require.Equal(t, ops.DefaultRetention, d.Cleanup.Retention)
	require.ErrorContains(t, d.Validate(), "WALFigures is nil")
	require.NoError(t, monitor.Config{Pool: pool}.WithDefaults().Validate())

	for _, tc := range []struct {
		cfg  monitor.Config
		want string
	}{
		{monitor.Config{}, "monitor: Config.Pool is nil; pass the outbox database's *pgxpool.Pool"},
		{monitor.Config{Pool: pool, Source: ops.WAL("slot_x")}, "monitor: Config.WALFigures is nil"},
		{monitor.Config{Pool: pool, Tables: outbox.Tables{Outbox: "a;b"}}, "not a plain identifier"},
		{monitor.Config{Pool: pool, RefreshInterval: -time.Second}, "ops: monitor RefreshInterval is -1s; use a positive duration, or 0 for the default 5s"},
		{monitor.Config{Pool: pool, WatchdogInterval: -time.Second}, "ops: monitor WatchdogInterval is -1s"},
		{monitor.Config{Pool: pool, CleanupInterval: -time.Second}, "ops: monitor CleanupInterval is -1s"},
		{monitor.Config{Pool: pool, CheckTimeout: -time.Second}, "ops: monitor CheckTimeout is -1s"},
		{monitor.Config{Pool: pool, Watchdog: ops.WatchdogConfig{MaxLag: -time.Second}}, "ops: watchdog StuckAfter"},
		{monitor.Config{Pool: pool, Cleanup: ops.CleanupConfig{BatchSize: -1}}, "ops: cleanup BatchSize is -1"},
		{monitor.Config{Pool: pool, Checks: []monitor.ReadyCheck{{Name: "broker"}}}, "monitor: every readiness check needs a Name and a Check func"},
	} {
		require.ErrorContains(t, tc.cfg.Validate(), tc.want)
		require.ErrorContains(t, tc.cfg.WithDefaults().Validate(), tc.want)
		_, err := monitor.New(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}
