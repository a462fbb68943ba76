package webhookconsumer_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer/webhookconsumer"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/webhookpub"
)

// ReadEvent reads back, byte for byte, what the sink sent: ids, source,
// type, topic, aggregate, headers that HTTP cannot carry as they are.
func TestReadEventRoundTrip(t *testing.T) {
	t.Parallel()
	secrets, err := webhookpub.ParseSecrets(secretNew)
	require.NoError(t, err)
	v, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: secrets})
	require.NoError(t, err)
	got := make(chan webhookconsumer.Event, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		require.NoError(t, v.Verify(r.Header, body))
		ev, err := webhookconsumer.ReadEvent(r.Header, body)
		require.NoError(t, err)
		got <- ev
	}))
	t.Cleanup(srv.Close)
	pub, err := webhookpub.New(webhookpub.Config{Endpoint: srv.URL, Secrets: secrets, Source: "eu: billing"})
	require.NoError(t, err)
	agg := uuid.New()
	hdrs := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "X-Tenant": " Zoë ", "space in name": "100%", "empty": ""}
	errs := pub.Publish(context.Background(), []relay.Message{{ID: 42, AggregateID: agg, Type: "order.placed", Topic: "order", Payload: []byte(`{"a": 1}`), Headers: hdrs}})
	require.NoError(t, errs[0])
	ev := <-got
	require.Equal(t, webhookconsumer.Event{WebhookID: "eu: billing:42", ID: 42, Source: "eu: billing", Type: "order.placed", Topic: "order",
		AggregateID: agg, Headers: hdrs, Payload: []byte(`{"a": 1}`)}, ev)
}

func TestVerifierConfig(t *testing.T) {
	t.Parallel()
	_, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{})
	require.ErrorContains(t, err, "Secrets is empty")
	s, err := webhookconsumer.ParseSecrets(secretNew)
	require.NoError(t, err)
	_, err = webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: s, Tolerance: -1})
	require.ErrorContains(t, err, "Tolerance")
	_, err = webhookconsumer.ReadEvent(http.Header{}, nil)
	require.ErrorContains(t, err, "outbox-event-id")
}
