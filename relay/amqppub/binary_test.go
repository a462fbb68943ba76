package amqppub_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/amqppub"
)

// A binary payload travels as the body byte for byte, with its content
// type in the content_type property; a JSON one keeps application/json.
func TestBinaryPayloadsCarryTheirContentType(t *testing.T) {
	t.Parallel()
	pub, q := bound(t, rabbittest.URL(), amqppub.Config{})
	data := []byte{0x0a, 0, 0xff, 0xfe, '\r', '\n', 0}
	agg := uuid.New()
	msgs := []relay.Message{
		{ID: 1, AggregateID: agg, Type: "t", Topic: q, Payload: data, ContentType: "application/x-protobuf"},
		{ID: 2, AggregateID: agg, Type: "t", Topic: q, Payload: []byte(`{"a": 1}`)},
		{ID: 3, AggregateID: agg, Type: "t", Topic: q, Payload: []byte{}, ContentType: "application/avro"},
	}
	for i, err := range pub.Publish(context.Background(), msgs) {
		require.NoError(t, err, i)
	}
	got := rabbittest.Get(t, rabbittest.Dial(t, rabbittest.URL()), q, 3, 200*time.Millisecond, 20*time.Second)
	require.Len(t, got, 3)
	require.Equal(t, data, got[0].Body)
	require.Equal(t, "application/x-protobuf", got[0].ContentType)
	require.Equal(t, `{"a": 1}`, string(got[1].Body))
	require.Equal(t, outbox.ContentTypeJSON, got[1].ContentType)
	require.Empty(t, got[2].Body)
	require.Equal(t, "application/avro", got[2].ContentType)
}
