// Package pgtest gives each test its own schema on a real Postgres, migrated
// and dropped when the test ends, so tests run in parallel and leave nothing
// behind. The server comes from DATABASE_URL, defaulting to the local one.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/migrate"
)

// DefaultURL is the server tests use when DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns the test server's connection string.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's isolated outbox.
type DB struct {
	// Pool is connected to the test server; its search_path starts with the
	// test's schema, so unqualified business tables land there too.
	Pool *pgxpool.Pool
	// Tables names the test's outbox tables.
	Tables outbox.Tables
	// URL connects with the same search_path as Pool.
	URL string
}

// Options tunes New.
type Options struct {
	// MaxConns caps the pool. Defaults to 8.
	MaxConns int32
	// NoMigrate leaves the schema empty.
	NoMigrate bool
	// ServerURL is the server to create the schema on, e.g. a throwaway
	// cluster with other settings (tmppg). Defaults to URL().
	ServerURL string
}

// New creates a fresh schema, migrates it, and drops it when t ends.
func New(t testing.TB, opts ...Options) *DB {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.MaxConns == 0 {
		o.MaxConns = 8
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	server := o.ServerURL
	if server == "" {
		server = URL()
	}
	schema := Name(t)
	admin, err := pgxpool.New(ctx, server)
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.Exec(ctx, `CREATE SCHEMA "`+schema+`"`)
	require.NoError(t, err, "create test schema on %s; is Postgres running? (set DATABASE_URL)", redact(server))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgxpool.New(ctx, server)
		if err != nil {
			t.Logf("pgtest: drop schema %s: %v", schema, err)
			return
		}
		defer admin.Close()
		if _, err := admin.Exec(ctx, `DROP SCHEMA "`+schema+`" CASCADE`); err != nil {
			t.Logf("pgtest: drop schema %s: %v", schema, err)
		}
	})

	url := WithSearchPath(server, schema)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = o.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	tables := outbox.Tables{Schema: schema}.WithDefaults()
	if !o.NoMigrate {
		m, err := migrate.New(tables)
		require.NoError(t, err)
		_, err = m.Up(ctx, pool)
		require.NoError(t, err)
	}
	return &DB{Pool: pool, Tables: tables, URL: url}
}

// Name returns a unique, valid schema name derived from the test's name.
func Name(t testing.TB) string {
	var b strings.Builder
	b.WriteString("t_")
	for _, r := range strings.ToLower(t.Name()) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 40 {
		s = s[:40]
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	return s + "_" + hex.EncodeToString(rnd[:])
}

// WithSearchPath adds search_path=schema to a connection URL.
func WithSearchPath(url, schema string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

func redact(url string) string {
	if i := strings.Index(url, "@"); i > 0 {
		if j := strings.Index(url, "://"); j >= 0 && j < i {
			return url[:j+3] + "***" + url[i:]
		}
	}
	return url
}
