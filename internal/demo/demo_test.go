package demo_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/demo"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
)

// The demo's own invariants are the test: every committed order's event
// delivered and applied once, nothing from rolled-back orders, forced
// redeliveries skipped, points exact.
func TestDemoRunsAndEveryInvariantHolds(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	rep, err := demo.Run(context.Background(), demo.Config{
		DatabaseURL: pgtest.URL(), Orders: 200, Writers: 4, Redeliver: 25, Out: &out, Progress: true,
		Timeout: 90 * time.Second,
	})
	require.NoError(t, err, out.String())
	rep.Print(&out)
	t.Log("\n" + out.String())
	require.True(t, rep.OK(), "failures: %v", rep.Failures)
	require.Equal(t, int64(200), rep.OrdersAttempted)
	require.Equal(t, int64(20), rep.OrdersRolledBack, "every 10th order reuses an id")
	require.Equal(t, int64(180), rep.OrdersCommitted)
	require.Equal(t, rep.OrdersCommitted, rep.EventsInOutbox)
	require.Equal(t, rep.OrdersCommitted, rep.Consumed)
	require.Equal(t, int64(25), rep.Redelivered)
	require.GreaterOrEqual(t, rep.DuplicatesSkipped, int64(25))
	require.Equal(t, rep.Points.Expected, rep.Points.Awarded)
	require.Contains(t, out.String(), "all invariants hold")
	require.Contains(t, out.String(), "loyalty points")
	require.Contains(t, out.String(), "dispatch lag")

	// The schema is gone afterwards.
	require.NotEmpty(t, rep.Schema)
	var n int
	pool := pgtest.New(t, pgtest.Options{NoMigrate: true}).Pool
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", rep.Schema).Scan(&n))
	require.Zero(t, n, "demo must drop its schema")
}

// With no database reachable and no way to start one, the demo fails with
// an error that says what to do.
func TestDemoUnreachableDatabaseSaysWhatToDo(t *testing.T) {
	t.Parallel()
	_, err := demo.Run(context.Background(), demo.Config{DatabaseURL: "postgres://nobody@127.0.0.1:1/x?connect_timeout=2", NoThrowaway: true, Timeout: 20 * time.Second})
	require.Error(t, err)
	require.Contains(t, err.Error(), "does not answer")
	require.Contains(t, err.Error(), "DATABASE_URL")
}

// On a machine where no server answers, the demo starts a throwaway
// cluster (as the postgres user when run by root) and removes it after.
func TestDemoStartsThrowawayClusterWhenNoServerAnswers(t *testing.T) {
	t.Parallel()
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("initdb/pg_ctl not on PATH in CI")
		}
		t.Skip("initdb and pg_ctl are not on the PATH")
	}
	var out bytes.Buffer
	rep, err := demo.Run(context.Background(), demo.Config{
		DatabaseURL: "postgres://nobody@127.0.0.1:1/x?connect_timeout=2", Orders: 60, Writers: 2, Redeliver: 5, Out: &out,
		Timeout: 90 * time.Second,
	})
	require.NoError(t, err, out.String())
	require.True(t, rep.OK(), "failures: %v", rep.Failures)
	require.Contains(t, out.String(), "starting a throwaway cluster")
	require.Contains(t, rep.Database, "127.0.0.1")
}
