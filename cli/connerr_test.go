package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Every cause of a failed connection is said once, with the hint that
// fits it. Those the local trust-auth server can produce are produced;
// the server errors it cannot (wrong password, TLS-only pg_hba lines) are
// built as pgx returns them.
func TestConnectErrorSaysTheCauseOnceWithItsHint(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())

	cases := []struct {
		name, url, want string
	}{
		{"refused", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test", closed),
			fmt.Sprintf("cannot reach Postgres at 127.0.0.1:%d/test as postgres: connection refused; is Postgres running at 127.0.0.1:%d? start it, or set --database-url or DATABASE_URL", closed, closed)},
		{"no database", "postgres://postgres@127.0.0.1:5432/no_such_db_outbox_test?sslmode=disable",
			`cannot reach Postgres at 127.0.0.1:5432/no_such_db_outbox_test as postgres: database "no_such_db_outbox_test" does not exist; create it (createdb -h 127.0.0.1 -U postgres no_such_db_outbox_test), or name an existing database in --database-url or DATABASE_URL`},
		{"no role", "postgres://no_such_role_outbox_test@127.0.0.1:5432/test",
			`cannot reach Postgres at 127.0.0.1:5432/test as no_such_role_outbox_test: role "no_such_role_outbox_test" does not exist; create the role (createuser -h 127.0.0.1 no_such_role_outbox_test, or CREATE ROLE no_such_role_outbox_test LOGIN), or check the user in --database-url or DATABASE_URL`},
		{"no socket", "host=/nonexistent/outbox-test port=5433 dbname=test user=postgres",
			"cannot reach Postgres at /nonexistent/outbox-test:5433/test as postgres: no server socket in /nonexistent/outbox-test; is Postgres running on this machine (port 5433)? start it, or set the host in --database-url or DATABASE_URL"},
	}
	for _, tc := range cases {
		g := &globals{databaseURL: tc.url, logLevel: "info", logFormat: "text", stderr: io.Discard}
		pool, err := g.connect(context.Background(), 1)
		if err == nil {
			pool.Close()
		}
		require.EqualError(t, err, tc.want, tc.name)
	}

	cfg, err := pgconn.ParseConfig("postgres://app:secret@db.example:6543/shop")
	require.NoError(t, err)
	for _, tc := range []struct {
		err  *pgconn.PgError
		want string
	}{
		{&pgconn.PgError{Code: "28P01", Message: `password authentication failed for user "app"`},
			`cannot reach Postgres at db.example:6543/shop as app: password authentication failed for user "app"; check the password of user app in --database-url or DATABASE_URL (or PGPASSWORD, ~/.pgpass)`},
		{&pgconn.PgError{Code: "28000", Message: `no pg_hba.conf entry for host "10.0.0.7", user "app", database "shop", no encryption`},
			`cannot reach Postgres at db.example:6543/shop as app: no pg_hba.conf entry for host "10.0.0.7", user "app", database "shop", no encryption; the server accepts this user only over TLS: add sslmode=require (or verify-full) to --database-url or DATABASE_URL`},
		{&pgconn.PgError{Code: "3D000", Message: `database "shop" does not exist`},
			`cannot reach Postgres at db.example:6543/shop as app: database "shop" does not exist; create it (createdb -h db.example -p 6543 -U app shop), or name an existing database in --database-url or DATABASE_URL`},
		{&pgconn.PgError{Code: "53300", Message: "sorry, too many clients already"},
			"cannot reach Postgres at db.example:6543/shop as app: sorry, too many clients already; the server has no free connection slot: try again, raise max_connections, or put a pooler in front"},
	} {
		err := connectError(fmt.Errorf("failed to connect: %w", tc.err), cfg)
		require.EqualError(t, err, tc.want)
		require.NotContains(t, err.Error(), "secret")
	}
}
