package kafkapub_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// A message's own headers never shadow the relayer's: Record drops a user
// header with a reserved name (the relayer holds such rows, and Emit
// refuses them, but Record must not depend on either), writes each
// reserved header once, and writes them before the event's own, which is
// what lets a consumer take the first occurrence as the relayer's.
func TestRecordReservedHeadersComeOnceAndFirst(t *testing.T) {
	t.Parallel()
	agg := uuid.New()
	r := kafkapub.Record(relay.Message{
		ID:          42,
		AggregateID: agg,
		Type:        "order.placed",
		Topic:       "order",
		Payload:     []byte(`{}`),
		Headers: map[string]string{
			outbox.HeaderEventSource: "x",
			outbox.HeaderEventID:     "9",
			outbox.HeaderEventType:   "order.forged",
			outbox.HeaderContentType: "text/plain",
			"trace":                  "t",
		},
	}, "src")

	var keys []string
	values := map[string][]string{}
	for _, h := range r.Headers {
		keys = append(keys, h.Key)
		values[h.Key] = append(values[h.Key], string(h.Value))
	}
	require.Equal(t, []string{
		outbox.HeaderEventID, outbox.HeaderEventType, outbox.HeaderContentType, outbox.HeaderEventSource, "trace",
	}, keys, "each reserved header once, before the event's own")
	require.Equal(t, []string{"42"}, values[outbox.HeaderEventID], "the message id, not the user header")
	require.Equal(t, []string{"order.placed"}, values[outbox.HeaderEventType])
	require.Equal(t, []string{outbox.ContentTypeJSON}, values[outbox.HeaderContentType])
	require.Equal(t, []string{"src"}, values[outbox.HeaderEventSource], "the relayer's source, not the user header")
	require.Equal(t, []string{"t"}, values["trace"], "other headers are kept")
	require.Equal(t, agg.String(), string(r.Key), "the key is the aggregate id")
	require.Equal(t, "order", r.Topic)

	// Without a source the relayer stamps none, and a user event_source is
	// still dropped: it would otherwise become the dedupe key's source.
	r = kafkapub.Record(relay.Message{ID: 7, AggregateID: agg, Type: "order.placed", Topic: "order", Payload: []byte(`{}`),
		Headers: map[string]string{outbox.HeaderEventSource: "x"}}, "")
	for _, h := range r.Headers {
		require.NotEqual(t, outbox.HeaderEventSource, h.Key)
	}
	require.Len(t, r.Headers, 3)
}
