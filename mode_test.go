package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

func TestModeNames(t *testing.T) {
	t.Parallel()
	for _, m := range []outbox.Mode{outbox.ModeInsert, outbox.ModeInsertDelete, outbox.ModeMessage} {
		got, err := outbox.ParseMode(strings.ToUpper(m.String()))
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	_, err := outbox.ParseMode("delete")
	require.ErrorContains(t, err, `unknown emit mode "delete"; use insert, insert-delete or message`)
	require.False(t, outbox.ModeInsert.WALOnly())
	require.True(t, outbox.ModeInsertDelete.WALOnly())
	require.True(t, outbox.ModeMessage.WALOnly())

	_, err = outbox.NewProducer(outbox.Config{Mode: outbox.Mode(7)})
	require.ErrorContains(t, err, "Mode is 7; use ModeInsert, ModeInsertDelete or ModeMessage")
	// The WAL-only modes never lock nor notify: nothing would use either.
	p, err := outbox.NewProducer(outbox.Config{Mode: outbox.ModeMessage})
	require.NoError(t, err)
	require.True(t, p.Config().DisableAggregateLock)
	require.True(t, p.Config().DisableNotify)
}

// The WAL-only modes leave the table as it was, whether the transaction
// commits or rolls back, and draw their ids from the outbox's sequence:
// a row inserted afterwards gets a larger id, never a taken one. Without
// the WAL source, nothing publishes them; relay/walrelay's
// TestProducerModesThroughTheWAL checks what the broker receives.
func TestWALOnlyModesLeaveNoRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mode := range []outbox.Mode{outbox.ModeInsertDelete, outbox.ModeMessage} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db, p := setup(t, outbox.Config{Mode: mode})
			plain, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
			require.NoError(t, err)
			agg := uuid.New()
			ev := outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]int{"n": 1}}
			var ids []int64
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				id, err := p.Emit(ctx, tx, ev)
				require.NoError(t, err)
				batch, err := p.EmitBatch(ctx, tx, []outbox.Event{ev, ev, ev})
				require.NoError(t, err)
				ids = append([]int64{id}, batch...)
				return nil
			}))
			sdb, err := sql.Open("pgx", db.URL)
			require.NoError(t, err)
			defer sdb.Close()
			tx, err := sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			id, err := p.EmitSQL(ctx, tx, ev)
			require.NoError(t, err)
			batch, err := p.EmitBatchSQL(ctx, tx, []outbox.Event{ev, ev})
			require.NoError(t, err)
			require.NoError(t, tx.Rollback())
			ids = append(append(ids, id), batch...)
			for i := 1; i < len(ids); i++ {
				require.Greater(t, ids[i], ids[i-1], "ids ascend in input order")
			}
			require.Zero(t, countRows(t, db))

			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				id, err := plain.Emit(ctx, tx, ev)
				require.Greater(t, id, ids[len(ids)-1], "a row after them takes a fresh id of the same sequence")
				return err
			}))
			require.Equal(t, 1, countRows(t, db))
		})
	}
}

// An invalid event is refused before any SQL in every mode, as in
// ModeInsert: the caller's transaction stays usable.
func TestWALOnlyModesValidateFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mode := range []outbox.Mode{outbox.ModeInsertDelete, outbox.ModeMessage} {
		db, p := setup(t, outbox.Config{Mode: mode})
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "bad topic!.x", Payload: 1})
			require.ErrorIs(t, err, outbox.ErrInvalidTopic, mode.String())
			_, err = p.EmitBatch(ctx, tx, []outbox.Event{{AggregateID: uuid.New(), Type: "ok", Payload: 1}, {Type: "ok", Payload: 1}})
			require.ErrorIs(t, err, outbox.ErrNilAggregate, mode.String())
			var one int
			return tx.QueryRow(ctx, "SELECT 1").Scan(&one)
		}))
	}
}

// The sequence the WAL-only modes draw from is the id column's, also for
// the longest table name Tables.Validate allows.
func TestIDSequenceOfLongestTableName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	tables := outbox.Tables{Schema: db.Tables.Schema, Outbox: strings.Repeat("o", 41), Processed: db.Tables.Processed}
	require.NoError(t, tables.Validate())
	m, err := migrate.New(tables)
	require.NoError(t, err)
	_, err = m.Up(ctx, db.Pool)
	require.NoError(t, err)
	p, err := outbox.NewProducer(outbox.Config{Tables: tables, Mode: outbox.ModeMessage})
	require.NoError(t, err)
	var id, last int64
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1})
		require.NoError(t, err)
		return tx.QueryRow(ctx, `SELECT last_value FROM `+pgx.Identifier{tables.Schema, tables.Outbox + "_id_seq"}.Sanitize()).Scan(&last)
	}))
	require.Equal(t, last, id)
	var same bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_get_serial_sequence($1, 'id')::regclass = $2::regclass`,
		tables.OutboxIdent(), pgx.Identifier{tables.Schema, tables.Outbox + "_id_seq"}.Sanitize()).Scan(&same))
	require.True(t, same, "the id column's sequence")
}

// ModeInsertDelete's delete after a single insert finds its row through
// the primary key, however many rows the table holds (other producers'
// plain inserts, rows before a switch of source): currval is volatile, and
// compared bare it would be evaluated per row, a sequential scan.
func TestInsertDeleteUsesThePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{Mode: outbox.ModeInsertDelete})
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload)
		SELECT gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, 5000)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ANALYZE `+db.Tables.OutboxIdent())
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1})
		require.NoError(t, err)
		rows, err := tx.Query(ctx, `EXPLAIN `+outbox.DeleteOneSQL(p))
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		joined := strings.Join(lines, "\n")
		require.Contains(t, joined, "Index Scan using", joined)
		require.NotContains(t, joined, "Seq Scan", joined)
		return nil
	}))
	require.Equal(t, 5000, countRows(t, db))
}

// In ModeInsertDelete, a delete that fails or leaves the inserted rows in
// the table (a trigger or rule in its way) fails the emit with an error
// that says so, in every entry point: the caller's transaction must not
// commit with rows the WAL source's cleanup does not expect.
func TestInsertDeleteFailsWhenTheDeleteMisses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{Mode: outbox.ModeInsertDelete})
	_, err := db.Pool.Exec(ctx, `CREATE FUNCTION `+pgx.Identifier{db.Tables.Schema, "keep"}.Sanitize()+`() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
		CREATE TRIGGER keep BEFORE DELETE ON `+db.Tables.OutboxIdent()+` FOR EACH ROW EXECUTE FUNCTION `+pgx.Identifier{db.Tables.Schema, "keep"}.Sanitize()+`()`)
	require.NoError(t, err)
	ev := outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1}
	const want = "(ModeInsertDelete): deleted 0 rows, want the"

	pgxCases := map[string]func(tx pgx.Tx) error{
		"Emit": func(tx pgx.Tx) error { _, err := p.Emit(ctx, tx, ev); return err },
		"EmitBatch": func(tx pgx.Tx) error {
			_, err := p.EmitBatch(ctx, tx, []outbox.Event{ev, ev})
			return err
		},
		"QueueEmit": func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			if _, err := p.QueueEmit(ctx, b, ev); err != nil {
				return err
			}
			return tx.SendBatch(ctx, b).Close()
		},
	}
	for name, emit := range pgxCases {
		err := pgx.BeginFunc(ctx, db.Pool, emit)
		require.ErrorContains(t, err, want, name)
	}
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	defer sdb.Close()
	sqlCases := map[string]func(tx *sql.Tx) error{
		"EmitSQL": func(tx *sql.Tx) error { _, err := p.EmitSQL(ctx, tx, ev); return err },
		"EmitBatchSQL": func(tx *sql.Tx) error {
			_, err := p.EmitBatchSQL(ctx, tx, []outbox.Event{ev, ev})
			return err
		},
	}
	for name, emit := range sqlCases {
		tx, err := sdb.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.ErrorContains(t, emit(tx), want, name)
		require.NoError(t, tx.Rollback())
	}
	require.Zero(t, countRows(t, db), "every transaction rolled back")

	// A delete that fails is the caller's error too, the server's kept.
	_, err = db.Pool.Exec(ctx, `CREATE OR REPLACE FUNCTION `+pgx.Identifier{db.Tables.Schema, "keep"}.Sanitize()+`() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RAISE EXCEPTION ''no deletes here''; END'`)
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { _, err := p.Emit(ctx, tx, ev); return err })
	require.ErrorContains(t, err, "(ModeInsertDelete): ERROR: no deletes here")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
}
