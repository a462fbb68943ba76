package amqppub_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/amqppub"
)

// With CloudEvents on, every message carries the attributes as
// cloudEvents_ headers (the AMQP binding's application properties), with
// content_type as datacontenttype, read back from RabbitMQ.
func TestCloudEventsAMQPBinaryMode(t *testing.T) {
	t.Parallel()
	pub, q := bound(t, rabbittest.URL(), amqppub.Config{CloudEvents: &cloudevents.Config{Source: "/outbox/orders", DataSchema: "https://example.com/contracts/"}})
	agg := uuid.New()
	created := time.Date(2026, 3, 1, 12, 30, 45, 0, time.UTC)
	msgs := []relay.Message{
		{ID: 11, AggregateID: agg, Type: "order.placed", Topic: q, Payload: []byte(`{"total": 1}`), CreatedAt: created,
			Headers: map[string]string{outbox.HeaderEventVersion: "4", "cloudEvents_id": "forged"}},
		{ID: 12, AggregateID: agg, Type: "order.shipped", Topic: q, Payload: []byte(`{}`), CreatedAt: created},
	}
	for _, err := range pub.Publish(context.Background(), msgs) {
		require.NoError(t, err)
	}
	got := rabbittest.Get(t, rabbittest.Dial(t, rabbittest.URL()), q, 2, 200*time.Millisecond, 30*time.Second)
	require.Len(t, got, 2)
	h := got[0].Headers
	require.Equal(t, "1.0", h["cloudEvents_specversion"])
	require.Equal(t, "11", h["cloudEvents_id"])
	require.Equal(t, "/outbox/orders", h["cloudEvents_source"])
	require.Equal(t, "order.placed", h["cloudEvents_type"])
	require.Equal(t, agg.String(), h["cloudEvents_subject"])
	require.Equal(t, "2026-03-01T12:30:45Z", h["cloudEvents_time"])
	require.Equal(t, "https://example.com/contracts/order.placed/v4.schema.json", h["cloudEvents_dataschema"])
	require.NotContains(t, h, "cloudEvents_datacontenttype")
	require.Equal(t, "application/json", got[0].ContentType)
	require.Equal(t, "11", h[outbox.HeaderEventID])
	require.Equal(t, "12", got[1].Headers["cloudEvents_id"])
	require.NotContains(t, got[1].Headers, "cloudEvents_dataschema")
	require.ErrorContains(t, amqppub.Config{URL: rabbittest.URL(), CloudEvents: &cloudevents.Config{}}.Validate(), "amqppub: CloudEvents: cloudevents: Source is empty")
}
