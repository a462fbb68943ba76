package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	ob "github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cli"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// Two outboxes in one schema share its processed table: the second's
// `migrate up` adopts it, both emit and relay, and reverting one keeps
// the table the other still uses.
func TestTwoOutboxesInOneSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	b, err := devkafka.Start(devkafka.Config{})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	flags := func(table string, args ...string) []string {
		return append(args, "--database-url", db.URL, "--schema", db.Tables.Schema, "--table", table)
	}
	first, second := ob.Tables{Schema: db.Tables.Schema}.WithDefaults(), ob.Tables{Schema: db.Tables.Schema, Outbox: "second_outbox"}.WithDefaults()

	for _, tbl := range []ob.Tables{first, second} {
		code, out, stderr := outbox(t, flags(tbl.Outbox, "migrate", "up")...)
		require.Equal(t, 0, code, stderr)
		require.Contains(t, out, tbl.OutboxIdent()+" is at version")
	}
	emitAndRelay := func(tbl ob.Tables, n int) {
		t.Helper()
		p, err := ob.NewProducer(ob.Config{Tables: tbl})
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			for range n {
				if _, err := p.Emit(ctx, tx, ob.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"n": 1}}); err != nil {
					return err
				}
			}
			return nil
		}))
		root := cli.NewRoot(&strings.Builder{}, &strings.Builder{})
		root.SetArgs(flags(tbl.Outbox, "relay", "--brokers", b.Addr(), "--poll-interval", "50ms", "--source", tbl.Outbox))
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- root.ExecuteContext(rctx) }()
		require.Eventually(t, func() bool { return pendingRows(t, db, tbl) == 0 }, 30*time.Second, 50*time.Millisecond, tbl.OutboxIdent())
		cancel()
		require.NoError(t, <-done)
	}
	emitAndRelay(first, 5)
	emitAndRelay(second, 7)
	// One dedupe table serves consumers of both (source tells them apart).
	_, err = db.Pool.Exec(ctx, "INSERT INTO "+first.ProcessedIdent()+" (consumer, source, event_id) VALUES ('c', 'events_outbox', 1), ('c', 'second_outbox', 1)")
	require.NoError(t, err)

	code, out, stderr := outbox(t, flags(second.Outbox, "migrate", "down", "--to", "0", "--yes")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "kept "+first.ProcessedIdent()+": other outboxes of schema "+first.Schema+" are migrated")
	require.False(t, tableExists(t, db, second.OutboxIdent()))
	require.Equal(t, 2, countRows(t, db, "SELECT count(*) FROM "+first.ProcessedIdent()), "the shared table keeps its rows")

	// The first outbox works on: up to date, emits, relays.
	code, _, stderr = outbox(t, flags(first.Outbox, "migrate", "status")...)
	require.Equal(t, 0, code, stderr)
	emitAndRelay(first, 3)
	require.Equal(t, 8, countRows(t, db, "SELECT count(*) FROM "+first.OutboxIdent()))

	// The second comes back on the same table; the last outbox reverted
	// takes the processed table with it.
	code, _, stderr = outbox(t, flags(second.Outbox, "migrate", "up")...)
	require.Equal(t, 0, code, stderr)
	code, _, stderr = outbox(t, flags(second.Outbox, "migrate", "down", "--to", "0", "--yes")...)
	require.Equal(t, 0, code, stderr)
	code, out, stderr = outbox(t, flags(first.Outbox, "migrate", "down", "--to", "0", "--yes")...)
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, out, "kept")
	require.False(t, tableExists(t, db, first.ProcessedIdent()), "dropped with the last outbox")
	require.False(t, tableExists(t, db, first.OutboxIdent()))
}

// A table of the processed table's name that is not one is refused, not
// adopted.
func TestMigrateRefusesAForeignProcessedTable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	_, err := db.Pool.Exec(context.Background(), "CREATE TABLE "+db.Tables.ProcessedIdent()+" (id int)")
	require.NoError(t, err)
	code, _, stderr := outbox(t, "migrate", "up", "--database-url", db.URL, "--schema", db.Tables.Schema)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `migrate: version 1 (create_tables): ERROR: column "consumer" does not exist`)
}

func pendingRows(t *testing.T, db *pgtest.DB, tbl ob.Tables) int {
	return countRows(t, db, "SELECT count(*) FROM "+tbl.OutboxIdent()+" WHERE dispatched_at IS NULL")
}

func countRows(t *testing.T, db *pgtest.DB, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

func tableExists(t *testing.T, db *pgtest.DB, ident string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", ident).Scan(&ok))
	return ok
}
