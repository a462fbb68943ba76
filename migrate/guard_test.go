package migrate_test

import (
	"context"
	"encoding/json"
	"errors"
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

// plainInsert is what a producer in another language writes: no function,
// no lock. headers nil is SQL NULL.
func plainInsert(ctx context.Context, db *pgtest.DB, typ string, headers any) error {
	_, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+
		" (aggregate_id, type, payload, headers) VALUES (gen_random_uuid(), $1, '{}', $2::jsonb)", typ, headers)
	return err
}

func outboxCount(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()).Scan(&n))
	return n
}

// Migration 6: a plain INSERT of a row the relayer could never publish
// fails at once with SQLSTATE 23514, the rule in the constraint name, a
// message and a hint; nothing is written.
func TestGuardRefusesPlainInsertsTheRelayCannotPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const headersRule, typeRule = "events_outbox_headers_shape", "events_outbox_type_topic"
	type bad struct {
		typ       string
		headers   any
		rule, msg string
		hint      string
	}
	cases := map[string]bad{
		"empty type":         {"", nil, typeRule, "event type is empty", "topic.event"},
		"leading dot":        {".placed", nil, typeRule, "starts with '.', so it names no topic", "topic.event"},
		"space in topic":     {"order placed", nil, typeRule, "routes to topic 'order placed', which holds a character Kafka refuses", "letters, digits"},
		"non-ASCII topic":    {"ünïcode.placed", nil, typeRule, "which holds a character Kafka refuses", "letters, digits"},
		"250-char topic":     {strings.Repeat("x", 250) + ".placed", nil, typeRule, "topic name of 250 bytes; Kafka allows at most 249", "shorten"},
		"250-char bare type": {strings.Repeat("x", 250), nil, typeRule, "topic name of 250 bytes", "shorten"},
		"headers array":      {"order.placed", `["a"]`, headersRule, "headers are a JSON array, not an object", "object of string values"},
		"headers string":     {"order.placed", `"text"`, headersRule, "headers are a JSON string, not an object", "object of string values"},
		"headers number":     {"order.placed", `3`, headersRule, "headers are a JSON number, not an object", "object of string values"},
		"number value":       {"order.placed", `{"retries": 3}`, headersRule, "header 'retries' is empty or its value is not a string", `write numbers as "3"`},
		"null value":         {"order.placed", `{"k": null}`, headersRule, "header 'k' is empty or its value is not a string", "JSON strings"},
		"object value":       {"order.placed", `{"n": {"a": "b"}}`, headersRule, "header 'n'", "JSON strings"},
		"array value":        {"order.placed", `{"n": ["b"]}`, headersRule, "header 'n'", "JSON strings"}, // lax jsonpath would unwrap it
		"empty name":         {"order.placed", `{"": "x"}`, headersRule, "header '' is empty", "non-empty"},
		"bad type first":     {"bad topic.x", `{"retries": 3}`, typeRule, "which holds a character", "letters, digits"},
	}
	for _, name := range []string{outbox.HeaderEventID, outbox.HeaderEventType, outbox.HeaderContentType, outbox.HeaderEventSource} {
		cases["reserved "+name] = bad{"order.placed", `{"x": "y", "` + name + `": "1"}`, headersRule, "header '" + name + "' is set by the relayer", "reserved"}
	}
	for name, c := range cases {
		err := plainInsert(ctx, db, c.typ, c.headers)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", name, err)
		require.Equal(t, "23514", pgErr.Code, name)
		require.Equal(t, c.rule, pgErr.ConstraintName, name)
		require.Equal(t, db.Tables.Outbox, pgErr.TableName, name)
		require.Equal(t, db.Tables.Schema, pgErr.SchemaName, name)
		require.Contains(t, pgErr.Message, c.msg, name)
		require.Contains(t, pgErr.Hint, c.hint, name)
	}
	require.Zero(t, outboxCount(t, db))
}

// What the relayer publishes, and what Emit and <outbox>_emit write, goes
// in: no headers, JSON null, {}, string headers, dotted and undotted types,
// a 249-character topic, anything after the first '.'.
func TestGuardLetsPublishableRowsIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	good := []struct {
		typ     string
		headers any
	}{
		{"order.placed", nil},
		{"order.placed", "null"},
		{"order.placed", "{}"},
		{"order.placed", `{"trace": "00-abc-01", "retries": "3", "ünï": "✓ \"q\""}`},
		{"order", `{"traceparent": ""}`},
		{"pay-ment_2.captured.v2", nil},
		{"audit_log.\t\"any\" \\ ✓ text. after the dot", nil},
		{strings.Repeat("t", 249) + ".placed", nil},
		{strings.Repeat("t", 249), nil},
		{"order." + strings.Repeat("x", 100_000), `{"big": "` + strings.Repeat("h", 100_000) + `"}`},
	}
	for _, g := range good {
		require.NoError(t, plainInsert(ctx, db, g.typ, g.headers), "type %.60q headers %.60v", g.typ, g.headers)
	}

	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := p.EmitBatch(ctx, tx, []outbox.Event{
			{AggregateID: uuid.New(), Type: "order.placed", Payload: 1, Headers: map[string]string{"trace": "t"}},
			{AggregateID: uuid.New(), Type: "order.paid", Payload: 2},
		})
		if err != nil {
			return err
		}
		_, err = sqlEmit(ctx, tx, db, uuid.New(), "order.shipped", "{}", `{"trace": "t"}`)
		return err
	}))
	require.Equal(t, len(good)+3, outboxCount(t, db))
}

// The guard and Go's rules (outbox.Topic with no prefix; headers that
// decode to an object of strings, none empty or reserved) agree on every
// type and header the relay property test generates, and on the corners.
func TestGuardAgreesWithGosRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	types := []string{"order.placed", "order", "a", "A-Z_0-9.x", "v2.x", ".x", "", ".", "..", "x..", "bad topic.x",
		"tab\t.x", "ünïcode.placed", "ß", "order/x.y", "order:x", "order+x", "emoji✓.x",
		strings.Repeat("a", 249), strings.Repeat("a", 250), strings.Repeat("a", 249) + ".", strings.Repeat("a", 250) + "."}
	headers := []string{"", "null", "{}", `{"a": "b"}`, `{"a": ""}`, `{"": ""}`, `{"a": null}`, `{"a": 1}`, `{"a": true}`,
		`{"a": []}`, `{"a": ["b"]}`, `{"a": {}}`, `[]`, `["a"]`, `"s"`, `1`, `true`, `{"a": "b", "c": 2}`,
		`{"event_id": "1"}`, `{"Event_ID": "1"}`, `{"event_id ": "1"}`, `{"content-type": "x"}`, `{"event_source": "x"}`, `{"event_type": "x"}`}
	for _, typ := range types {
		for _, h := range headers {
			var arg any
			if h != "" {
				arg = h
			}
			err := plainInsert(ctx, db, typ, arg)
			_, topicErr := outbox.KafkaRouting{}.Destination(typ)
			want := topicErr == nil && goHeadersOK(h)
			if want {
				require.NoError(t, err, "type %.60q headers %s", typ, h)
				continue
			}
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "type %.60q headers %s: %v", typ, h, err)
			require.Equal(t, "23514", pgErr.Code)
		}
	}
}

// goHeadersOK is the header rule as Go states it: SQL NULL or JSON null,
// or a JSON object whose values are all strings (Emit's map[string]string)
// with no empty or reserved name.
func goHeadersOK(h string) bool {
	if h == "" || h == "null" {
		return true
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal([]byte(h), &raw) != nil {
		return false
	}
	for k, v := range raw {
		var s string
		if k == "" || outbox.IsReservedHeader(k) || len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
			return false
		}
	}
	return true
}

// The migration succeeds on a table that already holds rows the guard
// would refuse, and leaves them alone: the relayer still claims them (an
// UPDATE of dispatched_at, which a CHECK constraint, even NOT VALID, would
// refuse for such a row and so fail the whole claim), sets them back to
// pending and holds them, and an operator can park and unpark them. Down
// drops the guard.
func TestGuardLeavesRowsWrittenBeforeItAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	reverted, err := m.Down(ctx, db.Pool, 5)
	require.NoError(t, err)
	require.Equal(t, []int{8, 7, 6}, reverted)

	require.NoError(t, plainInsert(ctx, db, "bad topic.x", `{"retries": 3}`))
	require.NoError(t, plainInsert(ctx, db, "order.placed", `{"event_id": "7"}`))
	applied, err := m.Up(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int{6, 7, 8}, applied)
	require.Error(t, plainInsert(ctx, db, "bad topic.x", `{"retries": 3}`), "new rows are checked")

	// What the relayer and the operator verbs do to existing rows.
	for _, stmt := range []string{
		"UPDATE {{outbox}} SET dispatched_at = now()",
		"UPDATE {{outbox}} SET dispatched_at = NULL",
		"UPDATE {{outbox}} SET dispatched_at = NULL, requeued_at = now()",
	} {
		tag, err := db.Pool.Exec(ctx, strings.ReplaceAll(stmt, "{{outbox}}", db.Tables.OutboxIdent()))
		require.NoError(t, err, stmt)
		require.EqualValues(t, 2, tag.RowsAffected())
	}
	var ids []int64
	rows, err := db.Pool.Query(ctx, "SELECT id FROM "+db.Tables.OutboxIdent()+" ORDER BY id")
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	// Park then unpark (ops.Unpark re-inserts the row under its id with
	// requeued_at set), as `outbox events park/unpark` do.
	_, err = db.Pool.Exec(ctx, `WITH moved AS (DELETE FROM `+db.Tables.OutboxIdent()+` WHERE id = $1 RETURNING *)
INSERT INTO `+db.Tables.OutboxIdent()+` (id, aggregate_id, type, payload, headers, created_at, requeued_at)
SELECT id, aggregate_id, type, payload, headers, created_at, now() FROM moved`, ids[0])
	require.NoError(t, err, "an unparked row goes back whole")
	require.Equal(t, 2, outboxCount(t, db))

	reverted, err = m.Down(ctx, db.Pool, 5)
	require.NoError(t, err)
	require.Equal(t, []int{8, 7, 6}, reverted)
	var fn, trg int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_proc WHERE proname = 'events_outbox_guard' AND pronamespace = $1::regnamespace),
  (SELECT count(*) FROM pg_trigger WHERE tgrelid = $2::regclass AND NOT tgisinternal)`, db.Tables.Schema, db.Tables.OutboxIdent()).Scan(&fn, &trg))
	require.Zero(t, fn)
	require.Zero(t, trg)
	require.NoError(t, plainInsert(ctx, db, "bad topic.x", `{"retries": 3}`), "the guard is gone")
}

// Two outboxes in one schema get a guard each, named after their table,
// and dropping one leaves the other.
func TestGuardPerOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	a := outbox.Tables{Schema: db.Tables.Schema, Outbox: "billing_outbox", Processed: "billing_processed"}.WithDefaults()
	b := outbox.Tables{Schema: db.Tables.Schema, Outbox: "shipping_outbox", Processed: "shipping_processed"}.WithDefaults()
	var ms []*migrate.Migrator
	for _, tb := range []outbox.Tables{a, b} {
		m, err := migrate.New(tb)
		require.NoError(t, err)
		_, err = m.Up(ctx, db.Pool)
		require.NoError(t, err)
		ms = append(ms, m)
	}
	_, err := ms[0].Down(ctx, db.Pool, 5)
	require.NoError(t, err)
	insert := func(tb outbox.Tables) error {
		_, err := db.Pool.Exec(ctx, "INSERT INTO "+tb.OutboxIdent()+" (aggregate_id, type, payload, headers) VALUES (gen_random_uuid(), 'x.y', '{}', '[]')")
		return err
	}
	require.NoError(t, insert(a))
	var pgErr *pgconn.PgError
	require.True(t, errors.As(insert(b), &pgErr))
	require.Equal(t, "shipping_outbox_headers_shape", pgErr.ConstraintName)
}

// pgtest.WriteLegacy writes what only a producer before migration 6 could,
// for the relay tests; the guard is back on afterwards.
func TestWriteLegacyTurnsTheGuardOffForOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.WriteLegacy(t, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload, headers) VALUES (gen_random_uuid(), '', '{}', '[]')")
		return err
	})
	require.Equal(t, 1, outboxCount(t, db))
	require.Error(t, plainInsert(ctx, db, "", `[]`))
}
