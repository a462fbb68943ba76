package ops_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/ops"
)

// On an outbox with binary payloads on, show prints a binary payload in
// hex with its content type, and park and unpark move the row whole: its
// bytes and content type come back as they were.
func TestBinaryPayloadsShownParkedAndUnparkedWhole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t, pgtest.Options{BinaryPayloads: true})
	p, err := outbox.NewProducer(outbox.Config{Tables: d.Tables, BinaryPayloads: true})
	require.NoError(t, err)
	data := []byte{0x0a, 0, 0xff, 'x', 0}
	tx, err := d.Pool.Begin(ctx)
	require.NoError(t, err)
	id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: outbox.Bytes{ContentType: "application/x-protobuf", Data: data}})
	require.NoError(t, err)
	jsonID, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"n": 1}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	show := func(id int64, preview int) ops.EventDetail {
		ev, err := ops.ShowEvent(ctx, d.Pool, ops.ShowConfig{Tables: d.Tables, ID: id, PreviewBytes: preview})
		require.NoError(t, err)
		return ev
	}
	ev := show(id, 0)
	require.Equal(t, `\x0a00ff7800`, ev.Payload)
	require.Equal(t, "application/x-protobuf", ev.ContentType)
	require.Equal(t, 5, ev.PayloadBytes)
	require.False(t, ev.PayloadTruncated)
	ev = show(id, 2)
	require.Equal(t, `\x0a00`, ev.Payload)
	require.True(t, ev.PayloadTruncated)
	ev = show(jsonID, 0)
	require.Equal(t, `{"n": 1}`, ev.Payload)
	require.Empty(t, ev.ContentType)

	log := opstest.Logger(t)
	_, err = ops.Park(ctx, d.Pool, ops.ParkConfig{Tables: d.Tables, ID: id, Reason: "test", Apply: true, Logger: log})
	require.NoError(t, err)
	ev = show(id, -1)
	require.Equal(t, ops.EventParked, ev.State)
	require.Equal(t, `\x0a00ff7800`, ev.Payload)
	require.Equal(t, "application/x-protobuf", ev.ContentType)
	_, err = ops.Unpark(ctx, d.Pool, ops.UnparkConfig{Tables: d.Tables, ID: id, Apply: true, Logger: log})
	require.NoError(t, err)
	var got []byte
	var ct string
	require.NoError(t, d.Pool.QueryRow(ctx, "SELECT payload_bytes, content_type FROM "+d.Tables.OutboxIdent()+" WHERE id = $1 AND dispatched_at IS NULL AND payload IS NULL", id).Scan(&got, &ct))
	require.Equal(t, data, got)
	require.Equal(t, "application/x-protobuf", ct)
}
