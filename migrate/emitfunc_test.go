package migrate_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/contracts"
	"github.com/pgoutbox/outbox/internal/lockkey"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// emitFn is the SQL emit function of db's outbox (migration 5).
func emitFn(db *pgtest.DB) string {
	return `"` + db.Tables.Schema + `"."` + db.Tables.Outbox + `_emit"`
}

// sqlEmit calls the function in tx and returns the event's id.
func sqlEmit(ctx context.Context, tx pgx.Tx, db *pgtest.DB, agg uuid.UUID, typ, payload string, headers any) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, "SELECT "+emitFn(db)+"($1, $2, $3::jsonb, $4::jsonb)", agg, typ, payload, headers).Scan(&id)
	return id, err
}

func TestEmitFunctionWritesWhatEmitWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	agg := uuid.New()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	id, err := sqlEmit(ctx, tx, db, agg, "order.placed", `{"total": 42}`, `{"trace": "abc"}`)
	require.NoError(t, err)
	var noHeaders int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+emitFn(db)+"($1, 'order.paid', '{}')", agg).Scan(&noHeaders))
	require.NoError(t, tx.Commit(ctx))
	require.Greater(t, noHeaders, id)

	var gotAgg uuid.UUID
	var typ, payload string
	var headers *string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT aggregate_id, type, payload::text, headers::text FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).
		Scan(&gotAgg, &typ, &payload, &headers))
	require.Equal(t, agg, gotAgg)
	require.Equal(t, "order.placed", typ)
	require.Equal(t, `{"total": 42}`, payload)
	require.Equal(t, `{"trace": "abc"}`, *headers)
}

// Each refusal names what was wrong, carries a SQLSTATE of class 22 and a
// hint, and inserts nothing. The figures (reserved names, the size limit)
// are Go's.
func TestEmitFunctionRefusesWhatTheRelayCannotPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	agg := uuid.New()
	type bad struct {
		agg             uuid.UUID
		typ, payload    string
		headers         any
		code, msg, hint string
	}
	cases := map[string]bad{
		"nil aggregate":     {uuid.Nil, "order.placed", "{}", nil, "22023", "aggregate id is the nil UUID", "the id of the entity"},
		"empty type":        {agg, "", "{}", nil, "22023", "event type is empty", "order.placed"},
		"leading dot":       {agg, ".placed", "{}", nil, "22023", "names no topic", "topic.event"},
		"bad topic char":    {agg, "order placed", "{}", nil, "22023", `routes to topic 'order placed', which holds a character Kafka refuses`, "letters, digits"},
		"non-ASCII topic":   {agg, "ünïcode.placed", "{}", nil, "22023", "which holds a character Kafka refuses", "letters, digits"},
		"long topic":        {agg, strings.Repeat("x", 250), "{}", nil, "22023", "topic name of 250 bytes; Kafka allows at most 249", "shorten"},
		"headers array":     {agg, "order.placed", "{}", `["a"]`, "22023", "headers are a JSON array, not an object", "object of string values"},
		"headers string":    {agg, "order.placed", "{}", `"text"`, "22023", "headers are a JSON string, not an object", "object of string values"},
		"number header":     {agg, "order.placed", "{}", `{"retries": 3}`, "22023", "header 'retries' is empty or its value is not a string", `write numbers as "3"`},
		"nested header":     {agg, "order.placed", "{}", `{"n": {"a": "b"}}`, "22023", "header 'n' is empty or its value is not a string", "JSON strings"},
		"empty header name": {agg, "order.placed", "{}", `{"": "x"}`, "22023", "header '' is empty", "non-empty"},
		"null payload":      {agg, "order.placed", "", nil, "22004", "must not be NULL", "'{}'::jsonb"},
		"too large":         {agg, "order.placed", `"` + strings.Repeat("p", outbox.DefaultMaxRecordBytes) + `"`, nil, "22023", "the limit is 1048588", "shrink the event"},
	}
	for _, name := range []string{outbox.HeaderEventID, outbox.HeaderEventType, outbox.HeaderContentType, outbox.HeaderEventSource} {
		cases["reserved "+name] = bad{agg, "order.placed", "{}", `{"x": "y", "` + name + `": "1"}`, "22023", "header '" + name + "' is set by the relayer", "reserved"}
	}
	for name, c := range cases {
		var payload any = c.payload
		if c.payload == "" {
			payload = nil
		}
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT "+emitFn(db)+"($1, $2, $3::jsonb, $4::jsonb)", c.agg, c.typ, payload, c.headers).Scan(new(int64))
		})
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", name, err)
		require.Equal(t, c.code, pgErr.Code, name)
		require.Contains(t, pgErr.Message, c.msg, name)
		require.Contains(t, pgErr.Hint, c.hint, name)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Tables.OutboxIdent()).Scan(&n))
	require.Zero(t, n)
}

// The size check is outbox.KafkaRouting.Size, to the byte: the largest
// payload Go accepts, the function accepts; one byte more, it refuses.
func TestEmitFunctionSizeLimitIsGos(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for _, headers := range []map[string]string{nil, {"trace": "00-abc-01", "ünï": "✓"}} {
		n := outbox.DefaultMaxRecordBytes
		for (outbox.KafkaRouting{}).Size("order.placed", n, headers) > outbox.DefaultMaxRecordBytes {
			n--
		}
		var hdr any
		if headers != nil {
			hdr = headers
		}
		for _, size := range []int{n, n + 1} {
			payload := `"` + strings.Repeat("p", size-2) + `"` // JSONB prints a string as given
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			_, err = sqlEmit(ctx, tx, db, uuid.New(), "order.placed", payload, hdr)
			if size == n {
				require.NoError(t, err, "a payload of %d bytes with headers %v", size, headers)
			} else {
				require.ErrorContains(t, err, "the limit is 1048588", "a payload of %d bytes with headers %v", size, headers)
			}
			require.NoError(t, tx.Rollback(ctx))
		}
	}
}

// The function takes the lock Go's Emit takes: the same two keys,
// lockkey.Emit's namespace and lockkey.Bucket's bucket, for any aggregate.
func TestEmitFunctionTakesEmitsLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back
	want := map[int64]bool{}
	for range 64 {
		agg := uuid.New()
		_, err := sqlEmit(ctx, tx, db, agg, "order.placed", "{}", nil)
		require.NoError(t, err)
		want[int64(lockkey.Bucket(agg, outbox.DefaultLockBuckets))] = true
	}
	rows, err := tx.Query(ctx, `SELECT objid::int8 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
		AND classid::int8 = $1 AND pid = pg_backend_pid() AND objid::int8 <> 4294967295`, int64(uint32(db.Tables.LockNamespace())))
	require.NoError(t, err)
	buckets, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	got := map[int64]bool{}
	for _, b := range buckets {
		got[b] = true
	}
	require.Equal(t, want, got)
}

// A Go producer and a SQL producer on one aggregate serialise, either way
// round, and the one that waited gets the larger id.
func TestEmitFunctionAndGoEmitSerialisePerAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	producer, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	goEmit := func(tx pgx.Tx, agg uuid.UUID) (int64, error) {
		return producer.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]int{"n": 1}})
	}
	viaSQL := func(tx pgx.Tx, agg uuid.UUID) (int64, error) {
		return sqlEmit(ctx, tx, db, agg, "order.placed", "{}", nil)
	}
	type emitter func(pgx.Tx, uuid.UUID) (int64, error)
	for name, pair := range map[string][2]emitter{"go then sql": {goEmit, viaSQL}, "sql then go": {viaSQL, goEmit}, "sql then sql": {viaSQL, viaSQL}} {
		agg := uuid.New()
		first, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		id1, err := pair[0](first, agg)
		require.NoError(t, err, name)

		// Bounded wait: the second cannot get the lock while the first holds it.
		second, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = second.Exec(ctx, "SET LOCAL lock_timeout = '200ms'")
		require.NoError(t, err)
		_, err = pair[1](second, agg)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: the second emitter did not wait: %v", name, err)
		require.Equal(t, "55P03", pgErr.Code, name) // lock_not_available
		require.NoError(t, second.Rollback(ctx))

		// Unbounded: it waits until the first commits, then draws a larger id.
		second, err = db.Pool.Begin(ctx)
		require.NoError(t, err)
		done := make(chan int64, 1)
		go func() {
			id, err := pair[1](second, agg)
			if err == nil {
				err = second.Commit(ctx)
			}
			if err != nil {
				t.Error(name, err)
			}
			done <- id
		}()
		require.Eventually(t, func() bool {
			var waiting int
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid::int8 = $1",
				int64(uint32(db.Tables.LockNamespace()))).Scan(&waiting))
			return waiting == 1
		}, 5*time.Second, 10*time.Millisecond, name)
		select {
		case <-done:
			t.Fatalf("%s: the second emitter finished while the first held the lock", name)
		case <-time.After(50 * time.Millisecond):
		}
		require.NoError(t, first.Commit(ctx))
		id2 := <-done
		require.Greater(t, id2, id1, name)
	}
}

// needTool returns the path of a producer tool, or skips the test when it
// is missing, except in CI, where .ci/run installs it.
func needTool(t *testing.T, path, pkg string, check ...string) string {
	t.Helper()
	p, err := exec.LookPath(path)
	if err == nil && len(check) > 0 {
		err = exec.Command(p, check...).Run()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (%v); .ci/run installs %s", path, err, pkg)
		}
		t.Skipf("%s is missing (%v): apt-get install %s to run this test", path, err, pkg)
	}
	return p
}

// libpqEnv points libpq clients (psql, psycopg) at the test's schema.
func libpqEnv(db *pgtest.DB) []string {
	return append(os.Environ(), "PGOPTIONS=-csearch_path="+db.Tables.Schema)
}

// The Python producer of docs/producers.md, from 4 threads with a connection each, on
// 2 aggregates: every transaction sees only smaller ids of its aggregate
// committed before it (concurrent_test.py), and every event is there.
func TestEmitFunctionFromPython(t *testing.T) {
	t.Parallel()
	python := needTool(t, "/usr/bin/python3", "python3-psycopg", "-c", "import psycopg")
	db := pgtest.New(t)
	const n = 200
	cmd := exec.Command(python, filepath.Join("..", "examples", "producers", "concurrent_test.py"), pgtest.URL(), strconv.Itoa(n))
	cmd.Env = libpqEnv(db)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, n)
	perAgg := map[string]int{}
	for _, l := range lines {
		agg, _, _ := strings.Cut(l, " ")
		perAgg[agg]++
	}
	require.Len(t, perAgg, 2)
	var rows int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()+" WHERE headers ? 'trace' OR headers ? 'n'").Scan(&rows))
	require.Equal(t, n+1, rows, "the concurrent events and place_order's")
	requireContract(t, db, "headers ? 'trace'")
}

// requireContract checks that the one event where cond holds is an
// order.placed of the worked example's contract, in the version its
// event_version header names (examples/contracts).
func requireContract(t *testing.T, db *pgtest.DB, cond string) {
	t.Helper()
	set, err := contracts.Load(filepath.Join("..", "examples", "contracts", "contracts"))
	require.NoError(t, err)
	var (
		typ, version string
		payload      []byte
	)
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT type, coalesce(headers->>'event_version', ''), payload FROM "+db.Tables.OutboxIdent()+" WHERE "+cond).Scan(&typ, &version, &payload))
	v, err := strconv.Atoi(version)
	require.NoError(t, err, "the event_version header")
	_, err = set.Check(typ, v, payload)
	require.NoError(t, err, "the producer's %s follows its contract", payload)
}

// The psql snippet of docs/producers.md runs as shown, and a refused event says why
// and what to do.
func TestEmitFunctionFromPsql(t *testing.T) {
	t.Parallel()
	psql := needTool(t, "psql", "postgresql-client")
	db := pgtest.New(t)
	run := func(args ...string) (string, error) {
		cmd := exec.Command(psql, append([]string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", pgtest.URL()}, args...)...)
		cmd.Env = libpqEnv(db)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("-f", filepath.Join("..", "examples", "producers", "producer.sql"))
	require.NoError(t, err, out)
	var typ string
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT type FROM "+db.Tables.OutboxIdent()+" WHERE aggregate_id = '6ba7b810-9dad-11d1-80b4-00c04fd430c8'").Scan(&typ))
	require.Equal(t, "order.placed", typ)
	requireContract(t, db, "aggregate_id = '6ba7b810-9dad-11d1-80b4-00c04fd430c8'")

	out, err = run("-c", `SELECT events_outbox_emit(gen_random_uuid(), 'order.placed', '{}', '{"retries": 3}')`)
	require.Error(t, err)
	require.Contains(t, out, `ERROR:  outbox: header 'retries' is empty or its value is not a string (type 'order.placed')`)
	require.Contains(t, out, `HINT:  header names are non-empty and values are JSON strings: write numbers as "3"`)
}

// The producers' page shows the snippets the tests run.
func TestDocsShowTheProducerSnippets(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(filepath.Join("..", "docs", "producers.md"))
	require.NoError(t, err)
	for _, f := range []string{"producer.py", "producer.sql", "producer.js"} {
		snippet, err := os.ReadFile(filepath.Join("..", "examples", "producers", f))
		require.NoError(t, err)
		require.True(t, strings.Contains(string(page), string(snippet)), "docs/producers.md should show examples/producers/%s as it is", f)
	}
}

// <outbox>_emit_message (migration 7) refuses what the relay could not
// publish, before drawing an id, and otherwise draws the event's id from
// the outbox's sequence: the writer has no say in it.
func TestEmitMessageFunctionRefusesWhatTheRelayCannotPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	fn := `"` + db.Tables.Schema + `"."` + db.Tables.Outbox + `_emit_message"`
	agg := uuid.New()
	cases := map[string]struct {
		agg           uuid.UUID
		typ, payload  any
		headers       any
		code, message string
	}{
		"nil aggregate":   {uuid.Nil, "order.placed", "{}", nil, "22023", "aggregate id is the nil UUID"},
		"empty type":      {agg, "", "{}", nil, "22023", "names no valid Kafka topic"},
		"bad topic char":  {agg, "order placed", "{}", nil, "22023", "names no valid Kafka topic"},
		"long topic":      {agg, strings.Repeat("x", 250), "{}", nil, "22023", "names no valid Kafka topic"},
		"headers array":   {agg, "order.placed", "{}", `["a"]`, "22023", "headers are a JSON array, not an object"},
		"number header":   {agg, "order.placed", "{}", `{"retries": 3}`, "22023", "header 'retries' is empty, is not a string"},
		"reserved header": {agg, "order.placed", "{}", `{"event_id": "1"}`, "22023", "header 'event_id' is empty, is not a string or is set by the relayer"},
		"null payload":    {agg, "order.placed", nil, nil, "22004", "must not be NULL"},
	}
	for name, c := range cases {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT "+fn+"($1, $2, $3::jsonb, $4::jsonb)", c.agg, c.typ, c.payload, c.headers).Scan(new(int64))
		})
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", name, err)
		require.Equal(t, c.code, pgErr.Code, name)
		require.Contains(t, pgErr.Message, c.message, name)
		require.NotEmpty(t, pgErr.Hint, name)
	}
	var id, next int64
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT "+fn+"($1, 'order.placed', '{\"id\": 99}', '{\"trace\": \"x\"}')", agg).Scan(&id)
	}))
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT nextval($1::regclass)", `"`+db.Tables.Schema+`"."`+db.Tables.Outbox+`_id_seq"`).Scan(&next))
	require.Equal(t, int64(1), id, "no refusal drew an id; the first event drew the sequence's first")
	require.Equal(t, id+1, next)
}
