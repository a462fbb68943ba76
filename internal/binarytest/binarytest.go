// Package binarytest writes the events the tests of binary payloads relay
// (outbox.Bytes, on an outbox with binary payloads on), and checks what a
// sink received: the exact bytes and their content type.
package binarytest

import (
	"bytes"
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// Payloads are bytes JSONB would refuse or rewrite: not UTF-8, NULs,
// nothing at all, and JSON whose whitespace, key order, repeated keys and
// number text JSONB normalises.
func Payloads() []outbox.Bytes {
	return []outbox.Bytes{
		{ContentType: "application/x-protobuf", Data: []byte{0x0a, 0x00, 0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28}},
		{ContentType: "application/avro", Data: []byte{}},
		{ContentType: "application/octet-stream", Data: bytes.Repeat([]byte{0, 1, 2, 0xff, '\r', '\n'}, 300)},
		{ContentType: "application/json", Data: []byte("{\"b\" :1,  \"a\":[1e3, 1.50],\n\"b\": 2 }\n")},
		{ContentType: "application/vnd.orders+json; charset=utf-8", Data: []byte(`{"z":0.10,"z":"dup","\u00e9":"x"}`)},
	}
}

// Want is what a sink must deliver for one event.
type Want struct {
	Payload     []byte
	ContentType string
}

// Emit writes, in one transaction on aggregate agg, every one of Payloads
// through p (with Config.BinaryPayloads), a JSON event, one binary event
// through the table's <outbox>_emit_bytes, and one by plain INSERT; it
// returns what each id must arrive as. typ names their type.
func Emit(t testing.TB, db *pgtest.DB, pool *pgxpool.Pool, p *outbox.Producer, agg uuid.UUID, typ string) map[int64]Want {
	t.Helper()
	ctx := context.Background()
	want := map[int64]Want{}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, b := range Payloads() {
		id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: typ, Payload: b, Headers: map[string]string{"trace": "t"}})
		require.NoError(t, err)
		want[id] = Want{b.Data, b.ContentType}
	}
	id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: typ, Payload: []byte(`{"b" :1,"a":  2}`)})
	require.NoError(t, err)
	want[id] = Want{[]byte(`{"a": 2, "b": 1}`), outbox.ContentTypeJSON} // JSONB's text, as ever
	fn := db.Tables.OutboxIdent()[:len(db.Tables.OutboxIdent())-1] + `_emit_bytes"`
	sqlBytes := []byte{0, 0, 0x9f, 'x', 0}
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+fn+"($1, $2, $3, 'application/x-protobuf', '{\"trace\": \"s\"}')", agg, typ, sqlBytes).Scan(&id))
	want[id] = Want{sqlBytes, "application/x-protobuf"}
	require.NoError(t, tx.QueryRow(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload_bytes, content_type) VALUES ($1, $2, '\\xdeadbeef00', 'application/x-thrift') RETURNING id", agg, typ).Scan(&id))
	want[id] = Want{[]byte{0xde, 0xad, 0xbe, 0xef, 0}, "application/x-thrift"}
	require.NoError(t, tx.Commit(ctx))
	return want
}

// Check compares what arrived, id by id, with want: every id arrived
// (duplicates allowed), with its exact bytes and content type.
func Check(t testing.TB, want map[int64]Want, got map[int64]Want) {
	t.Helper()
	for id, w := range want {
		g, ok := got[id]
		require.True(t, ok, "event %d never arrived", id)
		require.Equal(t, w.ContentType, g.ContentType, "event %d's content type", id)
		require.True(t, bytes.Equal(w.Payload, g.Payload), "event %d: sent %q, received %q", id, w.Payload, g.Payload)
	}
}
