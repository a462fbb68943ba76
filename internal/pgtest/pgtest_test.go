package pgtest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The tests' database is created when the server is up and it is
// missing; an unreachable server is one line saying what to do.
// (t.Setenv: not parallel.)
func TestEnsureDatabaseCreatesTheTestDatabase(t *testing.T) {
	ctx := context.Background()
	base, err := pgx.ParseConfig(URL())
	require.NoError(t, err)
	name := Name(t)
	url := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", base.User, base.Host, base.Port, name)
	t.Setenv("DATABASE_URL", url)
	t.Cleanup(func() {
		cfg := base.Copy()
		cfg.Database = "postgres"
		admin, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		defer admin.Close(ctx)
		_, err = admin.Exec(ctx, `DROP DATABASE IF EXISTS "`+name+`"`)
		require.NoError(t, err)
	})

	require.NoError(t, ensureDatabase(ctx))
	require.NoError(t, ensureDatabase(ctx), "twice: the database is there")
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	var db string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	require.Equal(t, name, db)
	require.NoError(t, conn.Close(ctx))

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	t.Setenv("DATABASE_URL", "postgres://someone:pw@"+addr+"/test")
	err = ensureDatabase(ctx)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "\n")
	require.NotContains(t, err.Error(), "pw")
	require.True(t, strings.HasPrefix(err.Error(), "pgtest: the tests need Postgres at "+addr+" (DATABASE_URL postgres://***@"+addr+"/test, default postgres://***@127.0.0.1:5432/test?sslmode=disable): "), err.Error())
	require.True(t, strings.HasSuffix(err.Error(), "; start it, or set DATABASE_URL"), err.Error())
}
