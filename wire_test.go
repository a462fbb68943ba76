package outbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
)

// Every header the relayer sets is reserved, and Emit, EmitBatch and
// QueueEmit refuse each of them as an event's own header before any SQL
// runs (hence the nil transaction): a producer header named event_source
// would otherwise travel beside the relayer's and could become a
// consumer's dedupe key.
func TestEmitRefusesEveryReservedHeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := outbox.NewProducer(outbox.Config{})
	require.NoError(t, err)
	for _, name := range []string{outbox.HeaderEventID, outbox.HeaderEventType, outbox.HeaderContentType, outbox.HeaderEventSource} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.True(t, outbox.IsReservedHeader(name))
			ev := outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1, Headers: map[string]string{name: "x"}}
			_, err := p.Emit(ctx, nil, ev)
			require.ErrorIs(t, err, outbox.ErrInvalidHeaders)
			require.ErrorContains(t, err, `header "`+name+`" is set by the relayer`)
			_, err = p.EmitBatch(ctx, nil, []outbox.Event{ev})
			require.ErrorIs(t, err, outbox.ErrInvalidHeaders)
			batch := &pgx.Batch{}
			_, err = p.QueueEmit(ctx, batch, ev)
			require.ErrorIs(t, err, outbox.ErrInvalidHeaders)
			require.Zero(t, batch.Len(), "nothing queued")
		})
	}
	for _, name := range []string{"trace", "traceparent", "Event_ID", "event_id "} {
		require.False(t, outbox.IsReservedHeader(name), "%q is the event's own (Kafka header names are case-sensitive)", name)
	}
}
