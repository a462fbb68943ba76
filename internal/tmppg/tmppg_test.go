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
