package pgtest

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgident"
)

var roleSeq atomic.Int64

// Role creates a LOGIN role with no privileges, runs grants (statements
// in which {{role}} stands for the role's quoted name) and returns the
// role's name and a pool connected as it, with the test's search_path.
// Roles are cluster-wide, so the name is unique to the test. When t ends,
// the pool is closed and the role dropped. Anything it owns is reassigned
// to the session user of db.Pool first, and its grants are revoked.
func (db *DB) Role(t testing.TB, grants ...string) (string, *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := db.Tables.Schema + "_r" + strconv.FormatInt(roleSeq.Add(1), 10)
	if len(name) > pgident.MaxLen {
		name = name[len(name)-pgident.MaxLen:]
	}
	role := pgident.Quote(name)
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, stmt := range []string{"REASSIGN OWNED BY " + role + " TO SESSION_USER", "DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := db.Pool.Exec(ctx, stmt); err != nil {
				t.Logf("pgtest: drop role %s: %s: %v", name, stmt, err)
				return
			}
		}
	})
	for _, g := range grants {
		_, err := db.Pool.Exec(ctx, strings.ReplaceAll(g, "{{role}}", role))
		require.NoError(t, err, g)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.User = name
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return name, pool
}
