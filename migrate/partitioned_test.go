package migrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// partitionedDB is a test's outbox in the partitioned layout, with
// partitions of width ids for the first twenty widths.
func partitionedDB(t *testing.T, width int64) *pgtest.DB {
	t.Helper()
	return pgtest.New(t, pgtest.Options{Partitioned: true, PartitionWidth: width, PartitionedIDs: 20 * width})
}

func partitions(t *testing.T, db *pgtest.DB) []partition.Partition {
	t.Helper()
	ps, err := partition.List(context.Background(), db.Pool, db.Tables.OutboxIdent())
	require.NoError(t, err)
	return ps
}

// migrate up --partitioned on a fresh install: the outbox table becomes a
// table partitioned on id, with the plain table's name, columns, id
// sequence, indexes and guard, partitions from the sequence on, and the
// settings recorded; running it again changes nothing but the settings.
func TestEnablePartitionedReplacesAnEmptyOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	applied, err := m.EnablePartitioned(ctx, db.Pool, migrate.PartitionSettings{Width: 500})
	require.NoError(t, err)
	require.Len(t, applied, m.Latest())
	require.NoError(t, m.Validate(ctx, db.Pool), "the layout's mark is no version")

	p, err := m.Partitioning(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPartitioned, p.Layout)
	require.Equal(t, migrate.PartitionSettings{Width: 500, Ahead: migrate.DefaultPartitionAhead}, p.Settings)
	ps := partitions(t, db)
	require.Len(t, ps, 3, "two widths ahead of id 1: [0,500), [500,1000), [1000,1500)")
	require.Equal(t, int64(0), ps[0].From)
	require.Equal(t, int64(1500), ps[2].To)
	require.Equal(t, db.Tables.Outbox+"_p0000000000000000500", ps[1].Name)

	var seqOwner, pkey, pending string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT
	  (SELECT c.relname FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid WHERE d.objid = $1::regclass AND d.deptype = 'a'),
	  (SELECT conname FROM pg_constraint WHERE conrelid = $2::regclass AND contype = 'p'),
	  (SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $2::regclass AND c.relname = $3)`,
		db.Tables.Schema+"."+db.Tables.Outbox+"_id_seq", db.Tables.OutboxIdent(), db.Tables.Outbox+"_pending_idx").Scan(&seqOwner, &pkey, &pending))
	require.Equal(t, db.Tables.Outbox, seqOwner, "the id sequence belongs to the new table")
	require.Equal(t, db.Tables.Outbox+"_pkey", pkey)
	require.Contains(t, pending, "(id) WHERE (dispatched_at IS NULL)")

	_, err = m.EnablePartitioned(ctx, db.Pool, migrate.PartitionSettings{Ahead: 24 * time.Hour})
	require.NoError(t, err)
	p, err = m.Partitioning(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.PartitionSettings{Width: 500, Ahead: 24 * time.Hour}, p.Settings)
	require.Len(t, partitions(t, db), 3)
}

// Every way producers write lands in the partitions: Emit, EmitBatch, the
// SQL function, a plain INSERT; ids stay unique across partitions (the
// primary key is the partitioned table's), and the guard still refuses a
// chosen id and a row the relay cannot publish, naming the outbox table.
func TestPartitionedOutboxTakesEveryWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := partitionedDB(t, 10)
	ob, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	for i := 0; i < 30; i++ {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := ob.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"i": i}}); err != nil {
				return err
			}
			if _, err := ob.EmitBatch(ctx, tx, []outbox.Event{
				{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"i": i}},
				{AggregateID: uuid.New(), Type: "order.paid", Payload: map[string]int{"i": i}},
			}); err != nil {
				return err
			}
			if _, err := sqlEmit(ctx, tx, db, uuid.New(), "order.placed", `{"sql": true}`, nil); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order.placed', '{}')")
			return err
		})
		require.NoError(t, err)
	}
	var n, distinct, parts int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT id), count(DISTINCT tableoid) FROM "+db.Tables.OutboxIdent()).Scan(&n, &distinct, &parts))
	require.Equal(t, 150, n)
	require.Equal(t, n, distinct)
	require.Equal(t, 16, parts, "ids 1 to 150 in partitions of 10 ids from 0")

	_, err = db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (id, aggregate_id, type, payload) VALUES (3, gen_random_uuid(), 'order.placed', '{}')")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "428C9", pgErr.Code, "a chosen id is refused before it meets the primary key")
	require.Equal(t, db.Tables.Outbox, pgErr.TableName)

	err = plainInsert(ctx, db, "bad topic.placed", nil)
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "23514", pgErr.Code)
	require.Equal(t, db.Tables.Outbox+"_type_topic", pgErr.ConstraintName, "the rule names the outbox table, not the partition")
	require.Equal(t, db.Tables.Outbox, pgErr.TableName)
}

// The partitioned layout's script, run by another tool after the
// migrations' (as psql -f runs it, in one statement), leaves what
// EnablePartitioned does: the migrator sees the layout and its settings,
// producers insert.
func TestPartitionedScriptAgreesWithTheMigrator(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	var script strings.Builder
	require.NoError(t, m.UpScript(&script, 0))
	require.NoError(t, m.PartitionedScript(&script, migrate.PartitionSettings{Width: 1000}))
	_, err = db.Pool.Exec(ctx, script.String())
	require.NoError(t, err, script.String())
	require.NoError(t, m.Validate(ctx, db.Pool))
	p, err := m.Partitioning(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPartitioned, p.Layout)
	require.Equal(t, int64(1000), p.Settings.Width)
	require.Len(t, partitions(t, db), 3)
	require.NoError(t, plainInsert(ctx, db, "order.placed", nil))
}

// The layout replaces an empty outbox table only, and leaves one that
// holds rows as it was; nor does it take a table a WAL relay's publication
// holds.
func TestEnablePartitionedRefusesATableWithRowsOrPublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, plainInsert(ctx, db, "order.placed", nil))
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	_, err = m.EnablePartitioned(ctx, db.Pool, migrate.PartitionSettings{})
	require.ErrorIs(t, err, migrate.ErrNotEmpty)
	p, err := m.Partitioning(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPlain, p.Layout)
	require.Equal(t, 1, outboxCount(t, db))

	empty := pgtest.New(t)
	_, err = empty.Pool.Exec(ctx, "CREATE PUBLICATION "+empty.Tables.Schema+"_pub FOR TABLE "+empty.Tables.OutboxIdent())
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = empty.Pool.Exec(context.Background(), "DROP PUBLICATION "+empty.Tables.Schema+"_pub") })
	m, err = migrate.New(empty.Tables)
	require.NoError(t, err)
	_, err = m.EnablePartitioned(ctx, empty.Pool, migrate.PartitionSettings{})
	require.ErrorContains(t, err, "is in publication "+empty.Tables.Schema+"_pub")
}

// A binary from before the layout sees the layout's mark as a schema
// version newer than it knows, and refuses the table (it would neither
// make partitions nor drop them); migrate down to 0 takes the layout's
// table and mark with it.
func TestPartitionedLayoutIsRefusedByOlderBinariesAndRevertable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := partitionedDB(t, 100)
	var seen int
	// What currentSQL read before the layout: every version below binary
	// payloads' mark.
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT max(version) FROM "+db.Tables.Schema+".events_outbox_migrations WHERE version < 1000000").Scan(&seen))
	require.Greater(t, seen, 7, "an older binary refuses a version it does not know")

	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	reverted, err := m.Down(ctx, db.Pool, 0)
	require.NoError(t, err)
	require.Len(t, reverted, m.Latest())
	require.False(t, tableExists(t, db, db.Tables.OutboxIdent()))
	require.False(t, tableExists(t, db, db.Tables.Schema+".events_outbox_partitioning"))
	applied, err := m.Up(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, applied, m.Latest(), "a clean slate: the plain layout again")
	p, err := m.Partitioning(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPlain, p.Layout)
}

// Binary payloads on a partitioned outbox, either order: the emit
// function for bytes writes into the partitions, the table's CHECK still
// refuses a row with neither payload.
func TestPartitionedOutboxTakesBinaryPayloads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, binaryFirst := range []bool{true, false} {
		db := pgtest.New(t, pgtest.Options{BinaryPayloads: binaryFirst, Partitioned: true, PartitionWidth: 10})
		if !binaryFirst {
			m, err := migrate.New(db.Tables)
			require.NoError(t, err)
			_, err = m.EnableBinaryPayloads(ctx, db.Pool)
			require.NoError(t, err)
		}
		fn := `"` + db.Tables.Schema + `"."events_outbox_emit_bytes"`
		for i := range 25 {
			var id int64
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT "+fn+"(gen_random_uuid(), 'order.placed', '\\x0a02'::bytea, 'application/x-protobuf')").Scan(&id))
			require.Equal(t, int64(i+1), id)
		}
		var parts int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(DISTINCT tableoid) FROM "+db.Tables.OutboxIdent()+" WHERE payload_bytes IS NOT NULL").Scan(&parts))
		require.Equal(t, 3, parts, "ids 1 to 25 over partitions of 10")
		_, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order.placed', NULL)")
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%v", err)
		require.Equal(t, "23514", pgErr.Code, "binaryFirst=%v: %v", binaryFirst, err)
	}
}
