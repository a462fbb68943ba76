package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgident"
)

// Role connects as a new role that has only the grants given, and drops
// the role (with those grants) when the test that made it ends.
func TestRoleHasOnlyItsGrantsAndIsDroppedAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := New(t)
	var name string
	t.Run("role", func(t *testing.T) {
		var pool *pgxpool.Pool
		name, pool = db.Role(t, "GRANT USAGE ON SCHEMA "+pgident.Quote(db.Tables.Schema)+" TO {{role}}")
		var user string
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_user").Scan(&user))
		require.Equal(t, name, user)
		_, err := pool.Exec(ctx, "SELECT 1 FROM "+db.Tables.OutboxIdent())
		require.ErrorContains(t, err, "permission denied")
	})
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_roles WHERE rolname = $1", name).Scan(&n))
	require.Zero(t, n, "role %s is dropped", name)
}
