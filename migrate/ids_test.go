package migrate_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/sqltext"
	"github.com/pgoutbox/outbox/migrate"
)

// producerRole is a role with what a plain-SQL producer needs and nothing
// more: USAGE on the schema, INSERT on the outbox, USAGE on its id
// sequence (for the column default's nextval), and the grants in more.
func producerRole(t *testing.T, db *pgtest.DB, more ...string) *pgxpool.Pool {
	t.Helper()
	ids := sqltext.For(db.Tables.Schema, db.Tables.Outbox, db.Tables.Processed)
	_, pool := db.Role(t, append([]string{
		"GRANT USAGE ON SCHEMA " + ids.Schema + " TO {{role}}",
		"GRANT INSERT ON " + ids.Outbox + " TO {{role}}",
		"GRANT USAGE ON SEQUENCE " + ids.IDSeq + " TO {{role}}"}, more...)...)
	return pool
}

// nextID is the id the outbox's sequence hands out next.
func nextID(t *testing.T, db *pgtest.DB) int64 {
	t.Helper()
	var id int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM "+
		sqltext.For(db.Tables.Schema, db.Tables.Outbox, db.Tables.Processed).IDSeq).Scan(&id))
	return id
}

// requireChoseID asserts err is the guard's refusal of an id the writer
// chose.
func requireChoseID(t *testing.T, db *pgtest.DB, err error, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: %v", what, err)
	require.Equal(t, "428C9", pgErr.Code, "%s: %v", what, err) // generated_always
	require.Equal(t, "id", pgErr.ColumnName, what)
	require.Equal(t, db.Tables.Outbox, pgErr.TableName, what)
	require.Equal(t, db.Tables.Schema, pgErr.SchemaName, what)
	require.Contains(t, pgErr.Message, "may not choose the event id", what)
	require.Contains(t, pgErr.Hint, "let the outbox draw it", what)
}

// A role that may only INSERT cannot write an event under an id it
// chose, in any form an INSERT or COPY can take: not an id the sequence
// will draw later (the real event that draws it would then fail with a
// duplicate key), not in a session that drew ids before, not with
// OVERRIDING SYSTEM VALUE. The id it tried is still drawn by the next
// real emit. Ids the column default draws go in, one row or many, and
// so does everything Go's Emit, EmitBatch and <outbox>_emit write for
// that role.
func TestGuardRefusesAnIDTheWriterChose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for range 3 {
		db.InsertRaw(t, uuid.New(), "order.placed", "'{}'", "NULL")
	}
	producer := producerRole(t, db)
	tbl := db.Tables.OutboxIdent()
	next := nextID(t, db)
	insertID := `INSERT INTO ` + tbl + ` (id, aggregate_id, type, payload) VALUES ($1, gen_random_uuid(), 'order.placed', '{}')`

	// A fresh session: it never drew from the sequence.
	fresh, err := producer.Acquire(ctx)
	require.NoError(t, err)
	_, err = fresh.Exec(ctx, insertID, next)
	fresh.Release()
	requireChoseID(t, db, err, "a future id, from a session that never drew one")

	conn, err := producer.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `INSERT INTO `+tbl+` (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order.placed', '{}')`)
	require.NoError(t, err)
	var drawn int64 // RETURNING would need SELECT on the table
	require.NoError(t, conn.QueryRow(ctx, `SELECT currval($1)`, sqltext.For(db.Tables.Schema, db.Tables.Outbox, db.Tables.Processed).IDSeq).Scan(&drawn))
	require.Equal(t, next, drawn, "the refused id was not taken: the outbox draws it")

	for what, stmt := range map[string]string{
		"a future id, after drawing one": `INSERT INTO ` + tbl + ` (id, aggregate_id, type, payload) VALUES (` + itoa(drawn+5) + `, gen_random_uuid(), 'order.placed', '{}')`,
		"an old id":                      `INSERT INTO ` + tbl + ` (id, aggregate_id, type, payload) VALUES (1, gen_random_uuid(), 'order.placed', '{}')`,
		"OVERRIDING SYSTEM VALUE":        `INSERT INTO ` + tbl + ` (id, aggregate_id, type, payload) OVERRIDING SYSTEM VALUE VALUES (` + itoa(drawn+5) + `, gen_random_uuid(), 'order.placed', '{}')`,
		"one of many rows":               `INSERT INTO ` + tbl + ` (id, aggregate_id, type, payload) VALUES (DEFAULT, gen_random_uuid(), 'order.placed', '{}'), (` + itoa(drawn+5) + `, gen_random_uuid(), 'order.placed', '{}')`,
		"INSERT ... SELECT":              `INSERT INTO ` + tbl + ` (id, aggregate_id, type, payload) SELECT ` + itoa(drawn+5) + ` + g, gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, 3) g`,
		"an old id with requeued_at":     `INSERT INTO ` + tbl + ` (id, aggregate_id, type, payload, requeued_at) VALUES (1000, gen_random_uuid(), 'order.placed', '{}', now())`,
	} {
		_, err := conn.Exec(ctx, stmt)
		requireChoseID(t, db, err, what)
	}
	_, err = conn.Conn().CopyFrom(ctx, pgx.Identifier{db.Tables.Schema, db.Tables.Outbox}, []string{"id", "aggregate_id", "type", "payload"},
		pgx.CopyFromRows([][]any{{drawn + 9, uuid.New(), "order.placed", "{}"}}))
	requireChoseID(t, db, err, "COPY with ids")
	require.Equal(t, 4, outboxCount(t, db), "nothing refused was written")

	// Drawn ids: the default, row by row, in every form.
	for _, stmt := range []string{
		`INSERT INTO ` + tbl + ` (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order.placed', '{}'), (gen_random_uuid(), 'order.paid', '{}')`,
		`INSERT INTO ` + tbl + ` (id, aggregate_id, type, payload) VALUES (DEFAULT, gen_random_uuid(), 'order.placed', '{}')`,
		`INSERT INTO ` + tbl + ` (aggregate_id, type, payload) SELECT gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, 50)`,
	} {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	n, err := conn.Conn().CopyFrom(ctx, pgx.Identifier{db.Tables.Schema, db.Tables.Outbox}, []string{"aggregate_id", "type", "payload"},
		pgx.CopyFromRows([][]any{{uuid.New(), "order.placed", "{}"}, {uuid.New(), "order.paid", "{}"}}))
	require.NoError(t, err)
	require.EqualValues(t, 2, n)

	// Go's Emit and <outbox>_emit read the id back (RETURNING id), which
	// takes SELECT on it too.
	emitter := producerRole(t, db, "GRANT SELECT (id) ON "+tbl+" TO {{role}}")
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, emitter, func(tx pgx.Tx) error {
		id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1})
		if err != nil {
			return err
		}
		batch, err := p.EmitBatch(ctx, tx, []outbox.Event{
			{AggregateID: uuid.New(), Type: "order.placed", Payload: 2},
			{AggregateID: uuid.New(), Type: "order.paid", Payload: 3},
		})
		if err != nil {
			return err
		}
		fromSQL, err := sqlEmit(ctx, tx, db, uuid.New(), "order.shipped", "{}", nil)
		ids = append(append([]int64{id}, batch...), fromSQL)
		return err
	}))
	require.IsIncreasing(t, ids)
	require.Equal(t, 4+55+len(ids), outboxCount(t, db))
}

// Migration 6 let any INSERT with requeued_at set skip every check (it
// stood for an operator's unpark). From a producer's role it buys
// nothing now: the row is checked like any other.
func TestGuardChecksRowsWithRequeuedAtFromProducers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	producer := producerRole(t, db)
	_, err := producer.Exec(ctx, `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, headers, requeued_at)
VALUES (gen_random_uuid(), 'order.placed', '{}', '{"retries": 3}', now())`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "23514", pgErr.Code)
	require.Equal(t, "events_outbox_headers_shape", pgErr.ConstraintName)
	_, err = producer.Exec(ctx, `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, requeued_at)
VALUES (gen_random_uuid(), 'bad topic.x', '{}', now())`)
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "events_outbox_type_topic", pgErr.ConstraintName)
	require.Zero(t, outboxCount(t, db))
}

// Migration 7 on a table with rows, up and down: the rows stay as they
// are (the table is not rewritten), explicit ids are refused after up and
// taken again after down, and up applies again after down.
func TestDrawnIDsMigrationOnATableWithRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	reverted, err := m.Down(ctx, db.Pool, 6)
	require.NoError(t, err)
	require.Equal(t, []int{8, 7}, reverted)

	producer := producerRole(t, db)
	tbl := db.Tables.OutboxIdent()
	explicit := func(id int64) error {
		_, err := producer.Exec(ctx, `INSERT INTO `+tbl+` (id, aggregate_id, type, payload) VALUES ($1, gen_random_uuid(), 'order.placed', '{}')`, id)
		return err
	}
	for range 100 {
		db.InsertRaw(t, uuid.New(), "order.placed", "'{}'", "NULL")
	}
	require.NoError(t, explicit(5000), "before migration 7 a plain INSERT chooses its id")
	type state struct {
		Rows, Sum, FileNode int64
	}
	read := func() state {
		var s state
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), sum(id), (SELECT relfilenode::int8 FROM pg_class WHERE oid = $1::regclass) FROM `+tbl, tbl).
			Scan(&s.Rows, &s.Sum, &s.FileNode))
		return s
	}
	before := read()

	applied, err := m.Up(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int{7, 8}, applied)
	require.Equal(t, before, read(), "rows untouched, table not rewritten")
	requireChoseID(t, db, explicit(5001), "after up")

	reverted, err = m.Down(ctx, db.Pool, 6)
	require.NoError(t, err)
	require.Equal(t, []int{8, 7}, reverted)
	require.Equal(t, before, read())
	var fns int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname = 'events_outbox_id_drawn' AND pronamespace = $1::regnamespace`,
		db.Tables.Schema).Scan(&fns))
	require.Zero(t, fns, "down drops the id function")
	require.NoError(t, explicit(5001), "down restores migration 6's guard")

	applied, err = m.Up(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int{7, 8}, applied)
	requireChoseID(t, db, explicit(5002), "after up again")
	require.Equal(t, before.Rows+1, read().Rows)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
