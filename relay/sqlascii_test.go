package relay_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// sqlASCIIDatabase creates a database of its own with ENCODING
// 'SQL_ASCII', where text is bytes that Postgres never checks or
// converts, and drops it when t ends. It returns its URL.
func sqlASCIIDatabase(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, pgtest.EnsureDatabase(ctx))
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "t_sql_ascii_" + hex.EncodeToString(rnd[:])
	admin, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgident.Quote(name)+" WITH ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if admin, err := pgx.Connect(ctx, pgtest.URL()); err == nil {
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgident.Quote(name)+" WITH (FORCE)")
			_ = admin.Close(ctx)
		}
	})
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err, "DATABASE_URL must be a URL for this test")
	u.Path = "/" + name
	return u.String()
}

// In a SQL_ASCII database a header's value is whatever bytes the
// producer wrote, UTF-8 or not; the relayer publishes them byte for byte,
// as docs/producers.md promises (nothing is rewritten), not with U+FFFD in place
// of the bytes that are not UTF-8.
func TestHeadersOfASQLASCIIDatabaseArePublishedByteForByte(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8, ServerURL: sqlASCIIDatabase(t)})
	var enc string
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SHOW server_encoding").Scan(&enc))
	require.Equal(t, "SQL_ASCII", enc)
	broker, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	b := &bundle{db: db, broker: broker}

	// Latin-1 bytes, as a producer in a SQL_ASCII database writes them,
	// and an escaped quote and newline around them.
	const value = "caf\xe9 \xff\xfe \"q\"\n\u00e9"
	_, err = db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+
		" (aggregate_id, type, payload, headers) VALUES ($1, 'order.placed', '{}', jsonb_build_object('x-name', $2::text, 'k\xe9y', 'v'))", uuid.New(), value)
	require.NoError(t, err)

	run(t, b.relayer(t, nil))
	recs := b.consume(t, 1, 20*time.Second, "order")
	require.Len(t, recs, 1)
	require.Equal(t, value, recs[0].Headers["x-name"], "the header's bytes as stored")
	require.Equal(t, "v", recs[0].Headers["k\xe9y"], "the header's name as stored")
	require.Empty(t, b.holds(t))
}
