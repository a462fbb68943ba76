package outbox_test

import (
	"bytes"
	"context"
	stdjson "encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// binaryPayloads are bytes JSONB would refuse or rewrite: not UTF-8, NULs,
// nothing at all, and JSON whose whitespace, key order, repeated keys and
// number text JSONB normalises.
var binaryPayloads = []outbox.Bytes{
	{ContentType: "application/x-protobuf", Data: []byte{0x0a, 0x00, 0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28}},
	{ContentType: "application/avro", Data: []byte{}},
	{ContentType: "application/octet-stream", Data: bytes.Repeat([]byte{0, 1, 2, 0xff}, 300)},
	{ContentType: "application/json", Data: []byte("{\"b\" :1,  \"a\":[1e3, 1.50],\n\"b\": 2 }\n")},
	{ContentType: "application/vnd.orders+json; charset=utf-8", Data: []byte(`{"z":0.10,"z":"dup","\u00e9":"x"}`)},
}

func setupBinary(t *testing.T, cfg outbox.Config) (*pgtest.DB, *outbox.Producer) {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{BinaryPayloads: true})
	cfg.Tables = db.Tables
	cfg.BinaryPayloads = true
	p, err := outbox.NewProducer(cfg)
	require.NoError(t, err)
	return db, p
}

type storedRow struct {
	payload     *string
	bytes       []byte
	contentType *string
	headers     map[string]string
}

func readRow(t *testing.T, db *pgtest.DB, id int64) storedRow {
	t.Helper()
	var r storedRow
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT payload::text, payload_bytes, content_type, headers FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).
		Scan(&r.payload, &r.bytes, &r.contentType, &r.headers))
	return r
}

// Every way of emitting writes a Bytes payload byte for byte with its
// content type, and a JSON payload beside it as before.
func TestEmitWritesBinaryPayloadsExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mode := range []outbox.Mode{outbox.ModeInsert, outbox.ModeInsertDelete} {
		db, p := setupBinary(t, outbox.Config{Mode: mode})
		if mode == outbox.ModeInsertDelete {
			// The rows are deleted in their transaction: read them from
			// a copy the delete does not touch.
			_, err := db.Pool.Exec(ctx, `CREATE TABLE kept (LIKE `+db.Tables.OutboxIdent()+`);
				CREATE FUNCTION keep() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO kept SELECT NEW.*; RETURN NEW; END$$;
				CREATE TRIGGER keep AFTER INSERT ON `+db.Tables.OutboxIdent()+` FOR EACH ROW EXECUTE FUNCTION keep()`)
			require.NoError(t, err)
		}
		agg := uuid.New()
		var events []outbox.Event
		for _, b := range binaryPayloads {
			events = append(events, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: b, Headers: map[string]string{"trace": "t"}})
		}
		events = append(events, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: stdjson.RawMessage(`{"n": 1}`)})
		bp := binaryPayloads[0]
		events = append(events, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: &bp, Version: 3})

		var ids []int64
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		for _, ev := range events {
			id, err := p.Emit(ctx, tx, ev)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		batchIDs, err := p.EmitBatch(ctx, tx, events)
		require.NoError(t, err)
		b := &pgx.Batch{}
		q, err := p.QueueEmit(ctx, b, events[0])
		require.NoError(t, err)
		require.NoError(t, tx.SendBatch(ctx, b).Close())
		require.NoError(t, tx.Commit(ctx))
		ids = append(append(ids, batchIDs...), q.ID)

		sqlDB := stdlib.OpenDBFromPool(db.Pool)
		stx, err := sqlDB.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, ev := range events {
			id, err := p.EmitSQL(ctx, stx, ev)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		sqlIDs, err := p.EmitBatchSQL(ctx, stx, events)
		require.NoError(t, err)
		require.NoError(t, stx.Commit())
		require.NoError(t, sqlDB.Close())
		ids = append(ids, sqlIDs...)

		table := db.Tables.OutboxIdent()
		if mode == outbox.ModeInsertDelete {
			require.Zero(t, countRows(t, db))
			table = "kept"
		}
		want := append(append(append(append(events, events...), events[0]), events...), events...)
		require.Len(t, ids, len(want))
		for i, id := range ids {
			var r storedRow
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT payload::text, payload_bytes, content_type, headers FROM "+table+" WHERE id = $1", id).
				Scan(&r.payload, &r.bytes, &r.contentType, &r.headers))
			ev := want[i]
			if b, ok := ev.Payload.(outbox.Bytes); ok {
				require.Nil(t, r.payload, "row %d", i)
				require.Equal(t, b.Data, r.bytes, "row %d (%s)", i, b.ContentType)
				require.NotNil(t, r.bytes, "an empty payload is stored as empty bytes, not NULL")
				require.Equal(t, b.ContentType, *r.contentType)
				require.Equal(t, "t", r.headers["trace"])
				continue
			}
			if b, ok := ev.Payload.(*outbox.Bytes); ok {
				require.Equal(t, b.Data, r.bytes)
				require.Equal(t, "3", r.headers[outbox.HeaderEventVersion])
				continue
			}
			require.Equal(t, `{"n": 1}`, *r.payload)
			require.Nil(t, r.bytes)
			require.Nil(t, r.contentType)
		}
	}
}

// What Emit refuses of a Bytes payload, before any SQL: the transaction
// stays usable.
func TestEmitRefusesBadBinaryPayloads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	agg := uuid.New()
	ev := func(b outbox.Bytes) outbox.Event {
		return outbox.Event{AggregateID: agg, Type: "order.placed", Payload: b}
	}
	proto := outbox.Bytes{ContentType: "application/x-protobuf", Data: []byte{1, 0, 0xff}}

	// A table without the setting, with a Producer that knows it.
	plain, p := setup(t, outbox.Config{})
	tx, err := plain.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = p.Emit(ctx, tx, ev(proto))
	require.ErrorIs(t, err, outbox.ErrBinaryPayloadsOff)
	require.ErrorContains(t, err, "--binary-payloads")
	_, err = p.EmitBatch(ctx, tx, []outbox.Event{{AggregateID: agg, Type: "order.placed", Payload: 1}, ev(proto)})
	require.ErrorIs(t, err, outbox.ErrBinaryPayloadsOff)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "no statement was sent")
	// JSON events on that table are written as they always were.
	_, err = p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]int{"n": 1}})
	require.NoError(t, err)

	// A Producer that says the table has the setting when it has not:
	// the statement fails, naming the missing column.
	wrong, err := outbox.NewProducer(outbox.Config{Tables: plain.Tables, BinaryPayloads: true})
	require.NoError(t, err)
	tx2, err := plain.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx2.Rollback(ctx) }()
	_, err = wrong.Emit(ctx, tx2, ev(proto))
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "42703", pgErr.Code)

	_, err = outbox.NewProducer(outbox.Config{BinaryPayloads: true, Mode: outbox.ModeMessage})
	require.ErrorContains(t, err, "ModeMessage")

	db, bp := setupBinary(t, outbox.Config{MaxRecordBytes: 1000, Contracts: orderContracts(t)})
	for _, tc := range []struct {
		name string
		ev   outbox.Event
		want error
		msg  string
	}{
		{"empty content type", ev(outbox.Bytes{Data: []byte{1}}), outbox.ErrInvalidPayload, "is empty"},
		{"no subtype", ev(outbox.Bytes{ContentType: "protobuf", Data: []byte{1}}), outbox.ErrInvalidPayload, "type/subtype"},
		{"control character", ev(outbox.Bytes{ContentType: "application/x\nproto\n", Data: []byte{1}}), outbox.ErrInvalidPayload, "printable ASCII"},
		{"too long", ev(outbox.Bytes{ContentType: "application/" + strings.Repeat("x", 250), Data: []byte{1}}), outbox.ErrInvalidPayload, "255"},
		{"JSON that is not", ev(outbox.Bytes{ContentType: "application/json", Data: []byte{0xff}}), outbox.ErrInvalidPayload, "not valid JSON"},
		{"oversize", outbox.Event{AggregateID: agg, Type: "shipment.sent", Payload: outbox.Bytes{ContentType: "application/x-protobuf", Data: make([]byte, 900)}}, outbox.ErrPayloadTooLarge, "the limit is 1000"},
		{"not JSON for a contract", ev(proto), outbox.ErrContractViolation, "JSON Schema"},
		{"JSON that breaks its contract", ev(outbox.Bytes{ContentType: "application/json", Data: []byte(`{"total": 1}`)}), outbox.ErrContractViolation, "total_cents"},
	} {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = bp.Emit(ctx, tx, tc.ev)
		require.ErrorIs(t, err, tc.want, tc.name)
		require.ErrorContains(t, err, tc.msg, tc.name)
		require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "%s: no statement was sent", tc.name)
		require.NoError(t, tx.Rollback(ctx))
	}

	// The size counts the raw bytes: 500 bytes of NULs fit a limit that
	// their JSON text (a base64 string or an array) would not.
	tx3, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx3.Rollback(ctx) }()
	_, err = bp.Emit(ctx, tx3, outbox.Event{AggregateID: agg, Type: "shipment.sent", Payload: outbox.Bytes{ContentType: "application/x-protobuf", Data: make([]byte, 500)}})
	require.NoError(t, err)
	// A JSON Bytes payload that keeps its contract is written as is, with
	// the version checked.
	id, err := bp.Emit(ctx, tx3, ev(outbox.Bytes{ContentType: "application/json", Data: []byte(`{ "total_cents":1 , "total_cents": 2}`)}))
	require.NoError(t, err)
	require.NoError(t, tx3.Commit(ctx))
	r := readRow(t, db, id)
	require.Equal(t, `{ "total_cents":1 , "total_cents": 2}`, string(r.bytes))
	require.Equal(t, "2", r.headers[outbox.HeaderEventVersion])
}

// The Go size check and the SQL function agree on where the limit falls
// for a binary event, but for what Emit adds for safety: the content
// type's extra length once more, and a byte.
func TestEmitBytesFunctionMatchesEmit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setupBinary(t, outbox.Config{})
	agg := uuid.New()
	fn := db.Tables.OutboxIdent()[:len(db.Tables.OutboxIdent())-1] + `_emit_bytes"`
	ct := "application/x-protobuf"
	emitSQL := func(n int) error {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "SELECT "+fn+"($1, 'order.placed', $2, $3, NULL)", agg, make([]byte, n), ct)
		return err
	}
	emitGo := func(n int) error {
		return outbox.Validate(p, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: outbox.Bytes{ContentType: ct, Data: make([]byte, n)}})
	}
	lo, hi := 1_000_000, 1_048_588
	for lo+1 < hi { // the largest n the function takes
		mid := (lo + hi) / 2
		if emitSQL(mid) == nil {
			lo = mid
		} else {
			hi = mid
		}
	}
	require.NoError(t, emitSQL(lo))
	err := emitSQL(lo + 1)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr))
	require.Equal(t, "22023", pgErr.Code)
	require.Contains(t, pgErr.Message, "record of")
	// Emit counts the content type's extra length twice (a CloudEvents
	// header may carry it too) and a byte to spare.
	spare := outbox.ContentTypeSizeExtra(ct) - (len(ct) - len(outbox.ContentTypeJSON))
	require.Equal(t, 7, spare)
	require.NoError(t, emitGo(lo-spare))
	require.ErrorIs(t, emitGo(lo-spare+1), outbox.ErrPayloadTooLarge)
}
