package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

func setup(t *testing.T, cfg outbox.Config) (*pgtest.DB, *outbox.Producer) {
	t.Helper()
	db := pgtest.New(t)
	cfg.Tables = db.Tables
	p, err := outbox.NewProducer(cfg)
	require.NoError(t, err)
	return db, p
}

func countRows(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()).Scan(&n))
	return n
}

func TestEmitWritesRowInCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	agg := uuid.New()

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	id, err := p.Emit(ctx, tx, outbox.Event{
		AggregateID: agg, Type: "order.placed",
		Payload: map[string]any{"total_cents": 1234},
		Headers: map[string]string{"traceparent": "00-abc-def-01"},
	})
	require.NoError(t, err)
	require.Positive(t, id)
	require.Equal(t, 0, countRows(t, db), "row must not be visible before commit")
	require.NoError(t, tx.Commit(ctx))

	var (
		gotAgg     uuid.UUID
		typ        string
		payload    []byte
		headers    map[string]string
		dispatched *time.Time
	)
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT aggregate_id, type, payload, headers, dispatched_at FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).
		Scan(&gotAgg, &typ, &payload, &headers, &dispatched))
	require.Equal(t, agg, gotAgg)
	require.Equal(t, "order.placed", typ)
	require.JSONEq(t, `{"total_cents":1234}`, string(payload))
	require.Equal(t, map[string]string{"traceparent": "00-abc-def-01"}, headers)
	require.Nil(t, dispatched)
}

func TestEmitRolledBackLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, countRows(t, db))
}

func TestEmitBatchReturnsIDsInInputOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	var events []outbox.Event
	for i := range 300 {
		events = append(events, outbox.Event{AggregateID: aggs[i%3], Type: "order.placed", Payload: map[string]int{"n": i}})
	}
	var ids []int64
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		ids, err = p.EmitBatch(ctx, tx, events)
		return err
	})
	require.NoError(t, err)
	require.Len(t, ids, 300)
	for i, id := range ids {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT (payload->>'n')::int FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).Scan(&n))
		require.Equal(t, i, n, "id %d", id)
	}
}

func TestEmitSQLWithDatabaseSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	defer sdb.Close()

	tx, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids, err := p.EmitBatchSQL(ctx, tx, []outbox.Event{
		{AggregateID: uuid.New(), Type: "order.placed", Payload: json.RawMessage(`{"quote":"a \"b\" \\ c","n":1}`)},
		{AggregateID: uuid.New(), Type: "order.shipped", Payload: []byte(`[1,2,3]`), Headers: map[string]string{"k": `v"\`}},
	})
	require.NoError(t, err)
	require.Len(t, ids, 2)
	require.NoError(t, tx.Commit())

	var payload string
	var headers map[string]string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT payload::text FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", ids[0]).Scan(&payload))
	require.JSONEq(t, `{"quote":"a \"b\" \\ c","n":1}`, payload)
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT headers FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", ids[1]).Scan(&headers))
	require.Equal(t, map[string]string{"k": `v"\`}, headers)
}

// zeros is a compact JSON array of n zeros: 2n+1 bytes that Postgres
// prints as 3n bytes ("[0, 0, ...]").
func zeros(n int) []byte {
	b := make([]byte, 0, 2*n+1)
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '0')
	}
	return append(b, ']')
}

func TestEmitRejectsBadInputBeforeWriting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{MaxRecordBytes: 1 << 20, TopicPrefix: "app."})
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	defer sdb.Close()

	agg := uuid.New()
	expands := zeros(500_000) // 1,000,001 bytes, 1,500,000 as JSONB text
	require.Len(t, expands, 1_000_001)
	big := strings.Repeat("v", 2<<20)
	cases := []struct {
		name string
		ev   outbox.Event
		want error
		msg  string
	}{
		{"empty type", outbox.Event{AggregateID: agg, Payload: 1}, outbox.ErrEmptyType, "set Event.Type"},
		{"nil aggregate", outbox.Event{Type: "order.placed", Payload: 1}, outbox.ErrNilAggregate, "set Event.AggregateID"},
		{"invalid json", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: []byte(`{"a":`)}, outbox.ErrInvalidPayload, "not valid JSON"},
		{"nil payload", outbox.Event{AggregateID: agg, Type: "order.placed"}, outbox.ErrInvalidPayload, "payload is nil"},
		{"unmarshalable", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: make(chan int)}, outbox.ErrInvalidPayload, "cannot marshal chan int"},
		{"bad topic char", outbox.Event{AggregateID: agg, Type: "order placed", Payload: 1}, outbox.ErrInvalidTopic, `character ' '`},
		{"empty topic", outbox.Event{AggregateID: agg, Type: ".placed", Payload: 1}, outbox.ErrInvalidTopic, `names no topic`},
		{"long topic", outbox.Event{AggregateID: agg, Type: strings.Repeat("x", 250), Payload: 1}, outbox.ErrInvalidTopic, "at most 249"},
		{"reserved header", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1, Headers: map[string]string{"event_id": "7"}}, outbox.ErrInvalidHeaders, "set by the relayer"},
		{"nul in payload", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]string{"s": "a\x00b"}}, outbox.ErrInvalidPayload, "NUL"},

		// Measured as the broker will see it: the payload after JSONB
		// normalisation (1,000,001 bytes given, 1,500,000 published), then
		// the headers and the type.
		{"payload grows past the limit in JSONB", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: json.RawMessage(expands)}, outbox.ErrPayloadTooLarge,
			"the payload after Postgres' JSONB normalisation is 1500000 bytes"},
		{"2 MB header value", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1, Headers: map[string]string{"big": big}}, outbox.ErrPayloadTooLarge,
			"the headers 2097155; the limit is 1048576 bytes (1.0 MiB): set MaxRecordBytes and the topic's max.message.bytes higher"},
		{"2 MB type suffix", outbox.Event{AggregateID: agg, Type: "order." + big, Payload: 1}, outbox.ErrPayloadTooLarge, "the type 2097158 and"},

		// What Postgres would refuse with an error that aborts the
		// transaction (22021, 22P05) is refused here instead.
		{"invalid UTF-8 in payload", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: []byte("{\"a\":\"\xff\"}")}, outbox.ErrInvalidPayload, "byte 6 (0xff) is not valid UTF-8"},
		// encoding/json would write U+FFFD for the bad byte: refused, not
		// rewritten (a real U+FFFD, or the text \ufffd, is fine: below).
		{"invalid UTF-8 in a Go value", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]string{"a": "bad\xff"}}, outbox.ErrInvalidPayload, "a string in the map[string]string is not valid UTF-8"},
		{"invalid UTF-8 in raw message", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: json.RawMessage("[\"ok\",\"\xc3\"]")}, outbox.ErrInvalidPayload, "not valid UTF-8"},
		{"NUL escape in payload", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: json.RawMessage(`{"a":"\u0000"}`)}, outbox.ErrInvalidPayload, `\u0000 at byte 6 is a NUL character`},
		{"lone high surrogate", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: json.RawMessage(`"\ud800"`)}, outbox.ErrInvalidPayload, `\ud800 at byte 1 is a UTF-16 high surrogate not followed by a low surrogate`},
		{"lone low surrogate", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: json.RawMessage(`["\udc00\ud800"]`)}, outbox.ErrInvalidPayload, "low surrogate without a high surrogate"},
		{"numeric overflow", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: json.RawMessage(`{"n":1e200000}`)}, outbox.ErrInvalidPayload, "200001 digits before the decimal point; Postgres numeric allows 131072"},
		{"numeric scale overflow", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: json.RawMessage(`1e-16384`)}, outbox.ErrInvalidPayload, "16384 digits after the decimal point"},
		{"NUL in header value", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1, Headers: map[string]string{"k": "a\x00b"}}, outbox.ErrInvalidHeaders, `the value of header "k" contains a NUL character`},
		{"NUL in header name", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1, Headers: map[string]string{"k\x00": "v"}}, outbox.ErrInvalidHeaders, `header name "k\x00" contains a NUL character`},
		{"invalid UTF-8 in header value", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1, Headers: map[string]string{"k": "caf\xe9"}}, outbox.ErrInvalidHeaders, `the value of header "k" is not valid UTF-8`},
		{"invalid UTF-8 in header name", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1, Headers: map[string]string{"caf\xe9": "v"}}, outbox.ErrInvalidHeaders, "is not valid UTF-8"},
		{"event_source header", outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1, Headers: map[string]string{"event_source": "x"}}, outbox.ErrInvalidHeaders, `header "event_source" is set by the relayer`},
		{"NUL in type", outbox.Event{AggregateID: agg, Type: "order.pla\x00ced", Payload: 1}, outbox.ErrInvalidType, `type "order.pla\x00ced" contains a NUL character`},
		{"invalid UTF-8 in type", outbox.Event{AggregateID: agg, Type: "order.caf\xe9", Payload: 1}, outbox.ErrInvalidType, "is not valid UTF-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// pgx: the typed error, then the transaction still works and
			// rolls back cleanly.
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			_, err = p.Emit(ctx, tx, tc.ev)
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), tc.msg)
			require.Less(t, len(err.Error()), 1000, "the message quotes what is wrong, not all of it")
			var one int
			require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "transaction must stay usable")
			require.NoError(t, tx.Rollback(ctx))

			// QueueEmit queues nothing.
			batch := &pgx.Batch{}
			_, err = p.QueueEmit(ctx, batch, tc.ev)
			require.ErrorIs(t, err, tc.want)
			require.Zero(t, batch.Len())

			// A bad event anywhere in a batch rejects the whole batch.
			tx, err = db.Pool.Begin(ctx)
			require.NoError(t, err)
			good := outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1}
			_, err = p.EmitBatch(ctx, tx, []outbox.Event{good, tc.ev})
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), "event 1 of 2")
			require.Contains(t, err.Error(), tc.msg)
			require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "transaction must stay usable")
			require.NoError(t, tx.Commit(ctx))

			// database/sql: the same.
			stx, err := sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = p.EmitSQL(ctx, stx, tc.ev)
			require.ErrorIs(t, err, tc.want)
			require.NoError(t, stx.QueryRowContext(ctx, "SELECT 1").Scan(&one), "transaction must stay usable")
			_, err = p.EmitBatchSQL(ctx, stx, []outbox.Event{good, tc.ev})
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), "event 1 of 2")
			require.NoError(t, stx.Commit())
		})
	}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = p.EmitBatch(ctx, tx, nil)
	require.ErrorIs(t, err, outbox.ErrEmptyBatch)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, countRows(t, db), "nothing may be written")
}

// What Postgres stores, Emit accepts, and the row holds the payload as
// Postgres normalised it; the record size counts that, not the bytes given.
func TestEmitAcceptsWhatPostgresStores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{MaxRecordBytes: 1 << 20})
	// As large as the refused [0,0,...] of the test above, but a string,
	// which JSONB prints as given.
	same := `"` + strings.Repeat("x", 1_000_001-2) + `"`
	// Over the limit as given; JSONB keeps the last of a repeated key.
	dup := `{"k":"` + strings.Repeat("x", 1<<20) + `","k":"small"}`
	for _, tc := range []struct {
		name, payload, stored string
		value                 any // a Go value instead of payload
	}{
		{"escaped backslash before u0000", `{"a":"\\u0000"}`, `{"a": "\\u0000"}`, nil},
		{"a real U+FFFD and the text \\ufffd in a Go value", "", "{\"y\": \"ok\uFFFD\", \"z\": \"lit\\\\ufffd\"}", map[string]string{"y": "ok\uFFFD", "z": `lit\ufffd`}},
		{"surrogate pair", `["\ud83d\ude00"]`, `["😀"]`, nil},
		{"numbers", `[1e3,1.5e-3,-0.0,1E+2,15e-1,0.10]`, `[1000, 0.0015, 0.0, 100, 1.5, 0.10]`, nil},
		{"repeated key", `{"b":1,"a":2,"a":3}`, `{"a": 3, "b": 1}`, nil},
		{"same raw size as the refused array, no growth", same, same, nil},
		{"repeated key over the limit as given", dup, `{"k": "small"}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var id int64
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				var err error
				var payload any = json.RawMessage(tc.payload)
				if tc.value != nil {
					payload = tc.value
				}
				id, err = p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: payload})
				return err
			})
			require.NoError(t, err)
			var stored string
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT payload::text FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).Scan(&stored))
			require.Equal(t, tc.stored, stored)
		})
	}
}

// An event whose record is exactly MaxRecordBytes passes; one byte more of
// payload fails. The payload is compact, so the check must count the space
// JSONB adds after the colon.
func TestEmitRecordSizeLimitIsExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const limit = 4096
	db, p := setup(t, outbox.Config{MaxRecordBytes: limit})
	typ, hdr := "order.placed", map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	payload := func(n int) json.RawMessage { // n bytes as JSONB prints it
		return json.RawMessage(`{"s":"` + strings.Repeat("x", n-len(`{"s": ""}`)) + `"}`)
	}
	n := 0
	for (outbox.KafkaRouting{}).Size(typ, n, hdr) < limit {
		n++
	}
	require.Equal(t, limit, outbox.KafkaRouting{}.Size(typ, n, hdr), "no payload length makes a record of exactly the limit; pick another")

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: typ, Payload: payload(n), Headers: hdr})
	require.NoError(t, err)
	var stored int
	require.NoError(t, tx.QueryRow(ctx, "SELECT octet_length(payload::text) FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).Scan(&stored))
	require.Equal(t, n, stored)

	_, err = p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: typ, Payload: payload(n + 1), Headers: hdr})
	require.ErrorIs(t, err, outbox.ErrPayloadTooLarge)
	require.ErrorContains(t, err, fmt.Sprintf("makes a record of %d bytes (4.0 KiB) as the broker will see it", outbox.KafkaRouting{}.Size(typ, n+1, hdr)))
	require.ErrorContains(t, err, "the limit is 4096 bytes (4.0 KiB)")
	_, err = p.EmitBatch(ctx, tx, []outbox.Event{
		{AggregateID: uuid.New(), Type: typ, Payload: payload(n), Headers: hdr},
		{AggregateID: uuid.New(), Type: typ, Payload: payload(n + 1), Headers: hdr},
	})
	require.ErrorIs(t, err, outbox.ErrPayloadTooLarge)
	require.ErrorContains(t, err, "event 1 of 2")
}

// Two transactions emitting for one aggregate: the second waits for the
// first to commit, so its id is larger even though it started inserting
// while the first was open.
func TestEmitAggregateLockOrdersIDsByCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	agg := uuid.New()

	tx1, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	// tx2 draws its id first if the lock does not work.
	tx2, err := db.Pool.Begin(ctx)
	require.NoError(t, err)

	id1, err := p.Emit(ctx, tx1, outbox.Event{AggregateID: agg, Type: "a.b", Payload: 1})
	require.NoError(t, err)

	done := make(chan int64)
	go func() {
		id, err := p.Emit(ctx, tx2, outbox.Event{AggregateID: agg, Type: "a.b", Payload: 2})
		if err != nil {
			t.Error(err)
		}
		done <- id
	}()
	select {
	case <-done:
		t.Fatal("second emitter on the same aggregate did not wait for the first")
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx1.Commit(ctx))
	id2 := <-done
	require.NoError(t, tx2.Commit(ctx))
	require.Greater(t, id2, id1)

	// Another aggregate does not wait.
	tx3, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = p.Emit(ctx, tx3, outbox.Event{AggregateID: agg, Type: "a.b", Payload: 3})
	require.NoError(t, err)
	other := uuid.New()
	ctx4, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = pgx.BeginFunc(ctx4, db.Pool, func(tx pgx.Tx) error {
		_, err := p.Emit(ctx4, tx, outbox.Event{AggregateID: other, Type: "a.b", Payload: 4})
		return err
	})
	require.NoError(t, err)
	require.NoError(t, tx3.Rollback(ctx))
}

// Concurrent writers on few aggregates: per aggregate, id order equals
// commit order. Each writer records the commit sequence it observed.
func TestEmitConcurrentWritersKeepCommitOrderPerAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	_, err := db.Pool.Exec(ctx, "CREATE TABLE commits (seq BIGSERIAL PRIMARY KEY, event_id BIGINT NOT NULL, aggregate_id UUID NOT NULL)")
	require.NoError(t, err)
	aggs := []uuid.UUID{uuid.New(), uuid.New()}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				agg := aggs[(w+i)%2]
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "a.b", Payload: i})
					if err != nil {
						return err
					}
					// The commits row is written last under the same
					// aggregate lock, so its seq follows commit order.
					_, err = tx.Exec(ctx, "INSERT INTO commits (event_id, aggregate_id) VALUES ($1, $2)", id, agg)
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, agg := range aggs {
		rows, err := db.Pool.Query(ctx, "SELECT event_id FROM commits WHERE aggregate_id = $1 ORDER BY seq", agg)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Len(t, ids, 120)
		require.IsIncreasing(t, ids)
	}
}

func TestNewProducerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewProducer(outbox.Config{Tables: outbox.Tables{Outbox: "Events; DROP"}})
	require.ErrorContains(t, err, "not a plain identifier")
	_, err = outbox.NewProducer(outbox.Config{MaxRecordBytes: -1})
	require.ErrorContains(t, err, "MaxRecordBytes is -1")
	_, err = outbox.NewProducer(outbox.Config{MaxRecordBytes: 100})
	require.ErrorContains(t, err, "the smallest event makes a record of")
	p, err := outbox.NewProducer(outbox.Config{})
	require.NoError(t, err)
	require.Equal(t, outbox.DefaultMaxRecordBytes, p.Config().MaxRecordBytes)
	_, err = outbox.NewProducer(outbox.Config{TopicPrefix: "bad prefix"})
	require.ErrorContains(t, err, "TopicPrefix")
	require.False(t, errors.Is(err, outbox.ErrEmptyType))
}
