package migrate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// relfilenode is the table's storage file: a rewrite (ALTER COLUMN TYPE, a
// volatile default) gives it a new one.
func relfilenode(t *testing.T, db *pgtest.DB, table string) uint32 {
	t.Helper()
	var n uint32
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT relfilenode FROM pg_class WHERE oid = to_regclass($1)", table).Scan(&n))
	return n
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Turning binary payloads on and off, on a table that holds rows: no
// rewrite, the JSON rows unchanged, the CHECK refusing what is neither
// kind, and off refused while a binary row is pending.
func TestBinaryPayloadsOnAndOffOnATableWithRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	st, err := m.BinaryPayloads(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.BinaryOff, st)

	agg := uuid.New()
	for i := 0; i < 50; i++ {
		db.InsertRaw(t, agg, "order.placed", `'{"n": 1,   "a": [1,2]}'`, "NULL")
	}
	_, err = db.Pool.Exec(ctx, "UPDATE events_outbox SET dispatched_at = now() WHERE id % 2 = 0")
	require.NoError(t, err)
	before := relfilenode(t, db, db.Tables.OutboxIdent())

	applied, err := m.EnableBinaryPayloads(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, applied, "the table was at the latest version")
	st, err = m.BinaryPayloads(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.BinaryOn, st)
	require.Equal(t, before, relfilenode(t, db, db.Tables.OutboxIdent()), "turning binary payloads on rewrote the table")
	_, err = m.EnableBinaryPayloads(ctx, db.Pool)
	require.NoError(t, err, "a second run is a no-op")
	// A binary from before the setting reads the highest version of the
	// migrations table and refuses a schema newer than it knows: it must
	// see one, or it would publish binary rows as empty messages. This
	// binary still sees its own version.
	var maxVersion int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT max(version) FROM events_outbox_migrations`).Scan(&maxVersion))
	require.Equal(t, 1000000, maxVersion, "binary payloads on: binaries that predate them must find a newer schema")
	require.NoError(t, m.Validate(ctx, db.Pool))
	mst, err := m.Status(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, m.Latest(), mst.Current)

	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events_outbox WHERE payload = '{"a": [1, 2], "n": 1}' AND payload_bytes IS NULL AND content_type IS NULL`).Scan(&n))
	require.Equal(t, 50, n)

	// What the CHECK refuses, as a plain INSERT would write it.
	for _, bad := range []string{
		`INSERT INTO events_outbox (aggregate_id, type, payload, payload_bytes, content_type) VALUES ($1, 'order.placed', '{}', '\x00', 'application/x-protobuf')`,
		`INSERT INTO events_outbox (aggregate_id, type) VALUES ($1, 'order.placed')`,
		`INSERT INTO events_outbox (aggregate_id, type, payload_bytes) VALUES ($1, 'order.placed', '\x00')`,
		`INSERT INTO events_outbox (aggregate_id, type, payload_bytes, content_type) VALUES ($1, 'order.placed', '\x00', '')`,
		`INSERT INTO events_outbox (aggregate_id, type, payload_bytes, content_type) VALUES ($1, 'order.placed', '\x00', 'protobuf')`,
		`INSERT INTO events_outbox (aggregate_id, type, payload_bytes, content_type) VALUES ($1, 'order.placed', '\x00', 'a/b' || chr(10))`,
		`INSERT INTO events_outbox (aggregate_id, type, payload, content_type) VALUES ($1, 'order.placed', '{}', 'application/json')`,
	} {
		_, err := db.Pool.Exec(ctx, bad, agg)
		require.Equal(t, "23514", pgCode(err), "%s: %v", bad, err)
	}
	var id int64
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO events_outbox (aggregate_id, type, payload_bytes, content_type) VALUES ($1, 'order.placed', '\x00ff', 'application/x-protobuf') RETURNING id`, agg).Scan(&id))

	// Down migrations wait for the setting to be off.
	_, err = m.Down(ctx, db.Pool, 0)
	require.ErrorContains(t, err, "turn them off first")

	// A pending binary row keeps the setting on, and the table takes
	// binary rows as before.
	err = m.DisableBinaryPayloads(ctx, db.Pool)
	require.ErrorIs(t, err, migrate.ErrBinaryRowsLeft)
	require.ErrorContains(t, err, "1 pending")
	st, err = m.BinaryPayloads(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.BinaryOn, st)
	_, err = db.Pool.Exec(ctx, `INSERT INTO events_outbox (aggregate_id, type, payload_bytes, content_type) VALUES ($1, 'order.placed', '\x01', 'application/x-protobuf')`, agg)
	require.NoError(t, err)

	_, err = db.Pool.Exec(ctx, "UPDATE events_outbox SET dispatched_at = now() WHERE payload_bytes IS NOT NULL")
	require.NoError(t, err)
	require.NoError(t, m.DisableBinaryPayloads(ctx, db.Pool))
	st, err = m.BinaryPayloads(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.BinaryOff, st)
	require.Equal(t, before, relfilenode(t, db, db.Tables.OutboxIdent()), "turning binary payloads off rewrote the table")
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events_outbox`).Scan(&n))
	require.Equal(t, 50, n, "the published binary rows are deleted, the JSON rows kept")
	var cols int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname IN ('payload_bytes', 'content_type') AND NOT attisdropped`, db.Tables.OutboxIdent()).Scan(&cols))
	require.Zero(t, cols)
	_, err = db.Pool.Exec(ctx, `INSERT INTO events_outbox (aggregate_id, type) VALUES ($1, 'order.placed')`, agg)
	require.Equal(t, "23502", pgCode(err), "payload is NOT NULL again: %v", err)
	require.NoError(t, m.Validate(ctx, db.Pool))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT max(version) FROM events_outbox_migrations`).Scan(&maxVersion))
	require.Equal(t, m.Latest(), maxVersion, "binary payloads off: every binary of this schema version may run again")

	// And on again, then down to 0 once off.
	_, err = m.EnableBinaryPayloads(ctx, db.Pool)
	require.NoError(t, err)
	require.NoError(t, m.DisableBinaryPayloads(ctx, db.Pool))
	_, err = m.Down(ctx, db.Pool, 0)
	require.NoError(t, err)
}

// The steps wait for their lock a bounded time: a transaction holding the
// table does not queue producers behind a waiting ALTER for long, and the
// step goes through once it ends.
func TestBinaryPayloadsWaitBoundedForTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE events_outbox IN ROW EXCLUSIVE MODE")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := m.EnableBinaryPayloads(ctx, db.Pool)
		done <- err
	}()
	// A producer's insert meanwhile is not blocked for more than the
	// step's lock timeout (2s) at a time.
	var insertErr error
	func() {
		c, cancel := context.WithTimeout(ctx, 10e9)
		defer cancel()
		_, insertErr = db.Pool.Exec(c, `INSERT INTO events_outbox (aggregate_id, type, payload) VALUES ($1, 'order.placed', '{}')`, uuid.New())
	}()
	require.NoError(t, insertErr)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-done)
	st, err := m.BinaryPayloads(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.BinaryOn, st)
}

// <outbox>_emit_bytes writes the bytes as given, and refuses what
// <outbox>_emit refuses, plus a missing or malformed content type.
func TestEmitBytesFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{BinaryPayloads: true})
	fn := `"` + db.Tables.Schema + `"."events_outbox_emit_bytes"`
	agg := uuid.New()
	data := []byte{0, 0xff, '{', ' ', '}', 0}
	var id int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT "+fn+"($1, 'order.placed', $2, 'application/x-protobuf', '{\"trace\": \"t\"}')", agg, data).Scan(&id))
	var got []byte
	var ct string
	var payload *string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT payload::text, payload_bytes, content_type FROM events_outbox WHERE id = $1", id).Scan(&payload, &got, &ct))
	require.Nil(t, payload)
	require.Equal(t, data, got)
	require.Equal(t, "application/x-protobuf", ct)

	for _, tc := range []struct {
		args []any
		code string
		msg  string
	}{
		{[]any{agg, "order.placed", nil, "application/x-protobuf", nil}, "22004", "must not be NULL"},
		{[]any{agg, "order.placed", data, nil, nil}, "22004", "must not be NULL"},
		{[]any{agg, "order.placed", data, "", nil}, "22023", "content type"},
		{[]any{agg, "order.placed", data, "protobuf", nil}, "22023", "content type"},
		{[]any{agg, "order.placed", data, "a/b\n", nil}, "22023", "content type"},
		{[]any{uuid.Nil, "order.placed", data, "a/b", nil}, "22023", "nil UUID"},
		{[]any{agg, "bad topic.x", data, "a/b", nil}, "22023", "character Kafka refuses"},
		{[]any{agg, "order.placed", data, "a/b", `{"content-type": "x"}`}, "22023", "set by the relayer"},
		{[]any{agg, "order.placed", make([]byte, 1048576), "a/b", nil}, "22023", "the limit is 1048588"},
	} {
		_, err := db.Pool.Exec(ctx, "SELECT "+fn+"($1, $2, $3, $4, $5::jsonb)", tc.args...)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", tc.msg, err)
		require.Equal(t, tc.code, pgErr.Code, pgErr.Message)
		require.Contains(t, pgErr.Message, tc.msg)
	}
}
