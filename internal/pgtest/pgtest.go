// Package pgtest gives each test its own schema on a real Postgres, migrated
// and dropped when the test ends, so tests run in parallel and leave nothing
// behind. The server comes from DATABASE_URL, defaulting to the local one.
package pgtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/sqltext"
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
	// BinaryPayloads turns binary payloads on for the outbox table after
	// migrating it (migrate.Migrator.EnableBinaryPayloads).
	BinaryPayloads bool
	// Partitioned makes the outbox table partitioned after migrating it
	// (migrate.Migrator.EnablePartitioned), with partitions of
	// PartitionWidth ids (default DefaultPartitionWidth) made for the
	// first PartitionedIDs ids (default 20 widths). OUTBOX_TEST_LAYOUT=
	// partitioned turns it on for every test that migrates, so that any
	// suite can be run against the partitioned layout.
	Partitioned    bool
	PartitionWidth int64
	PartitionedIDs int64
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
	if o.ServerURL == "" {
		if err := EnsureDatabase(ctx); err != nil {
			t.Fatal(err.Error())
		}
	}
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
		if o.BinaryPayloads {
			_, err = m.EnableBinaryPayloads(ctx, pool)
			require.NoError(t, err)
		}
		if o.Partitioned || os.Getenv("OUTBOX_TEST_LAYOUT") == "partitioned" {
			partitionTable(ctx, t, pool, m, tables, o)
		}
	}
	return &DB{Pool: pool, Tables: tables, URL: url}
}

// DefaultPartitionWidth is the width of a test's partitions (Options).
const DefaultPartitionWidth = 10_000

func partitionTable(ctx context.Context, t testing.TB, pool *pgxpool.Pool, m *migrate.Migrator, tables outbox.Tables, o Options) {
	t.Helper()
	width := cmp.Or(o.PartitionWidth, DefaultPartitionWidth)
	_, err := m.EnablePartitioned(ctx, pool, migrate.PartitionSettings{Width: width})
	require.NoError(t, err)
	ids := cmp.Or(o.PartitionedIDs, 20*width)
	for from := 2 * width; from < ids; from += width {
		_, err := partition.Add(ctx, pool, tables, tables.Outbox, from, from+width)
		require.NoError(t, err)
	}
}

// WriteLegacy runs write in one transaction with the outbox table's insert
// guard (migration 6) off, and commits: for rows a producer could only
// have written by plain INSERT before that migration, which the relayer
// must still publish or hold as it always did. The guard is off for that
// transaction alone (ALTER TABLE ... DISABLE TRIGGER, undone before
// COMMIT), so other sessions' inserts wait for it and are checked.
func (db *DB) WriteLegacy(t testing.TB, write func(ctx context.Context, tx pgx.Tx) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	guard := sqltext.For(db.Tables.Schema, db.Tables.Outbox, db.Tables.Processed).GuardTrigger
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "ALTER TABLE "+db.Tables.OutboxIdent()+" DISABLE TRIGGER "+guard); err != nil {
			return err
		}
		if err := write(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "ALTER TABLE "+db.Tables.OutboxIdent()+" ENABLE TRIGGER "+guard)
		return err
	})
	require.NoError(t, err, "write legacy rows")
}

// InsertRaw writes an outbox row by plain SQL, as a producer outside Go
// does, and returns its id. payload and headers are SQL expressions.
func (db *DB) InsertRaw(t testing.TB, agg uuid.UUID, typ, payload, headers string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.insertRawSQL(payload, headers), agg, typ).Scan(&id))
	return id
}

// InsertLegacy writes a row as InsertRaw does, but one that the insert
// guard (migration 6) refuses (WriteLegacy): a row written before that
// migration, which every relayer must still handle.
func (db *DB) InsertLegacy(t testing.TB, agg uuid.UUID, typ, payload, headers string) int64 {
	t.Helper()
	var id int64
	db.WriteLegacy(t, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, db.insertRawSQL(payload, headers), agg, typ).Scan(&id)
	})
	return id
}

func (db *DB) insertRawSQL(payload, headers string) string {
	return `INSERT INTO ` + db.Tables.OutboxIdent() + ` (aggregate_id, type, payload, headers) VALUES ($1, $2, ` + payload + `, ` + headers + `) RETURNING id`
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

var ensured struct {
	once sync.Once
	err  error
}

// EnsureDatabase creates the database URL names (DATABASE_URL, default
// "test") when the server is up and the database is missing, connecting
// to the server's "postgres" database to do it: `make test` on a fresh
// server needs no createdb. When that cannot be done it returns one line
// saying what to do. It runs once per test binary; test binaries that
// race to create the database all succeed.
func EnsureDatabase(ctx context.Context) error {
	ensured.once.Do(func() { ensured.err = ensureDatabase(ctx) })
	return ensured.err
}

func ensureDatabase(ctx context.Context) error {
	cfg, err := pgx.ParseConfig(URL())
	if err != nil {
		return fmt.Errorf("pgtest: DATABASE_URL %s: %v", redact(URL()), err)
	}
	where := fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("pgtest: the tests need Postgres at %s (DATABASE_URL %s, default %s): %s; start it, or set DATABASE_URL",
			where, redact(URL()), redact(DefaultURL), oneLine(err))
	}
	name := cfg.Database
	cfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pgtest: database %q does not exist at %s and cannot be created (connecting to database postgres: %s); run: createdb -h %s -p %d -U %s %s",
			name, where, oneLine(err), cfg.Host, cfg.Port, cfg.User, name)
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgident.Quote(name))
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		err = nil // another test binary created it first
	}
	if err != nil {
		return fmt.Errorf("pgtest: create database %q at %s: %s; run: createdb -h %s -p %d -U %s %s",
			name, where, oneLine(err), cfg.Host, cfg.Port, cfg.User, name)
	}
	return nil
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// ScratchDatabase creates a database of its own, prefix_<random>, on the
// tests' server, with the outbox tables migrated in its public schema
// (where the package-level Emit and default Tables write), for runnable
// examples, which have no testing.TB: they show the default tables yet
// share nothing. drop drops the database.
func ScratchDatabase(ctx context.Context, prefix string) (url string, drop func(), err error) {
	if err := EnsureDatabase(ctx); err != nil {
		return "", nil, err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := prefix + "_" + hex.EncodeToString(rnd[:])
	admin, err := pgx.Connect(ctx, URL())
	if err != nil {
		return "", nil, err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgident.Quote(name)); err != nil {
		return "", nil, err
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if admin, err := pgx.Connect(ctx, URL()); err == nil {
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgident.Quote(name)+" WITH (FORCE)")
			_ = admin.Close(ctx)
		}
	}
	url = withDatabase(URL(), name)
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		var m *migrate.Migrator
		if m, err = migrate.New(outbox.Tables{}); err == nil {
			_, err = m.Up(ctx, conn)
		}
		_ = conn.Close(ctx)
	}
	if err != nil {
		drop()
		return "", nil, err
	}
	return url, drop, nil
}

// withDatabase is url (a URL or a key=value string) naming database name.
func withDatabase(url, name string) string {
	if u, err := neturl.Parse(url); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	return url + " dbname=" + name // the last setting of a key wins
}
