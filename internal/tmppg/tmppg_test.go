package tmppg_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/tmppg"
)

func TestStartConnectStop(t *testing.T) {
	t.Parallel()
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("initdb/pg_ctl not on PATH in CI")
		}
		t.Skip("initdb and pg_ctl are not on the PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := tmppg.Start(ctx)
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, c.Stop())
	stopped = true
	_, err = pgx.Connect(ctx, c.URL())
	require.Error(t, err, "cluster must be gone after Stop")
}

// Kill crashes the server, and Up brings it back through crash recovery
// with every committed row.
func TestKillThenUp(t *testing.T) {
	if !tmppg.Available() {
		t.Skip("no Postgres binaries to start a cluster with")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := tmppg.Start(ctx)
	require.NoError(t, err)
	defer func() { _ = c.Stop() }()
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE t (n int); INSERT INTO t SELECT generate_series(1, 100)")
	require.NoError(t, err)
	require.NoError(t, c.Kill())
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the server is gone")
	require.NoError(t, c.Up(ctx))
	conn, err = pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	require.Equal(t, 100, n)
}
