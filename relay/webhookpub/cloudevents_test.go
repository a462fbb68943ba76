package webhookpub_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/consumer/webhookconsumer"
	"github.com/pgoutbox/outbox/internal/cetest"
	"github.com/pgoutbox/outbox/internal/webhookwire"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/webhookpub"
	"github.com/pgoutbox/outbox/routing"
)

type captured struct {
	header http.Header
	body   []byte
}

// With CloudEvents on, every request carries the attributes as ce-
// headers beside the Standard Webhooks ones: the npm CloudEvents SDK's
// HTTP binding parses and validates each request, the Standard Webhooks
// signature still verifies, and the webhook consumer does not take the
// ce- headers for the event's own.
func TestCloudEventsWebhookBinaryMode(t *testing.T) {
	t.Parallel()
	sdk := cetest.SDK(t)
	var mu sync.Mutex
	var got []captured
	p := publisher(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, captured{r.Header.Clone(), b})
		mu.Unlock()
	}), webhookpub.Config{Source: "billing eu", CloudEvents: &cloudevents.Config{Source: "urn:outbox:billing-eu", DataSchema: "https://example.com/contracts/"}})
	agg := uuid.New()
	created := time.Date(2026, 3, 1, 12, 30, 45, 0, time.UTC)
	msgs := []relay.Message{
		{ID: 5, AggregateID: agg, Type: "order.placed", Topic: "order", Payload: []byte(`{"name": "Zoë — 東京"}`), CreatedAt: created,
			Headers: map[string]string{outbox.HeaderEventVersion: "3", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
		{ID: 6, AggregateID: agg, Type: "order.shipped", Topic: "order", Payload: []byte(`{}`), CreatedAt: created},
	}
	for _, err := range p.Publish(context.Background(), msgs) {
		require.NoError(t, err)
	}
	require.Len(t, got, 2)
	h := got[0].header
	require.Equal(t, "5", h.Get("ce-id"))
	require.Equal(t, "urn:outbox:billing-eu", h.Get("ce-source"))
	require.Equal(t, "https://example.com/contracts/order.placed/v3.schema.json", h.Get("ce-dataschema"))
	require.Empty(t, h.Get("ce-datacontenttype"), "HTTP's binding carries it in Content-Type")
	require.NotEmpty(t, h.Get("webhook-signature"))

	secrets, err := webhookconsumer.ParseSecrets(testSecret)
	require.NoError(t, err)
	v, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: secrets})
	require.NoError(t, err)
	var in []cetest.Message
	for _, c := range got {
		require.NoError(t, v.Verify(c.header, c.body), "the Standard Webhooks signature holds beside the ce- headers")
		flat := map[string]string{}
		for k, vs := range c.header {
			flat[strings.ToLower(k)] = vs[0]
		}
		in = append(in, cetest.Message{Binding: "http", Headers: flat, Body: string(c.body)})
	}
	own, err := webhookwire.EventHeaders(got[0].header)
	require.NoError(t, err)
	require.Equal(t, map[string]string{outbox.HeaderEventVersion: "3", "traceparent": msgs[0].Headers["traceparent"]}, own,
		"ce- headers are not the event's own")

	res := sdk(in)
	for i, r := range res {
		require.Empty(t, r.Error, "the SDK refused request %d: %v", i, got[i].header)
	}
	e := res[0].Event
	require.Equal(t, "5", e["id"])
	require.Equal(t, "urn:outbox:billing-eu", e["source"])
	require.Equal(t, "order.placed", e["type"])
	require.Equal(t, agg.String(), e["subject"])
	require.Equal(t, "application/json", e["datacontenttype"])
	require.Equal(t, "https://example.com/contracts/order.placed/v3.schema.json", e["dataschema"])
	require.Equal(t, map[string]any{"name": "Zoë — 東京"}, e["data"])
	require.Equal(t, "6", res[1].Event["id"])
	require.NotContains(t, res[1].Event, "dataschema")
}

// The ce- headers count in the request's size, routing.Webhook with
// CloudEvents counts at least as much, and an event's own ce- header is
// refused: the name is the binding's.
func TestCloudEventsWebhookSize(t *testing.T) {
	t.Parallel()
	ce := &cloudevents.Config{Source: "urn:outbox:" + strings.Repeat("s", 150)}
	m := relay.Message{ID: 1, AggregateID: uuid.New(), Type: "order.placed", Topic: "order", Payload: []byte(`"` + strings.Repeat("x", 4000) + `"`), CreatedAt: time.Now(),
		Headers: map[string]string{outbox.HeaderEventVersion: "1"}}
	extra := routing.CloudEventsHTTPSize(ce.Attributes(m.CloudEvent()))
	require.Greater(t, extra, 250)
	plain := routing.Webhook{MaxBytes: 1 << 20, Signatures: 1}
	with := plain
	with.CloudEvents = true
	require.GreaterOrEqual(t, with.Size(m.Type, 2, m.Headers)-plain.Size(m.Type, 2, m.Headers), extra)

	base := webhookwire.Size(m.Type, m.Topic, "", 1, len(m.Payload), m.Headers, len(secrets(t)))
	p := publisher(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), webhookpub.Config{CloudEvents: ce, MaxBytes: base})
	errs := p.Publish(context.Background(), []relay.Message{m})
	require.Equal(t, relay.ReasonTooLarge, relay.ReasonOf(errs[0]), "%v", errs[0])
	m.Headers = map[string]string{"ce-partner": "acme"}
	errs = p.Publish(context.Background(), []relay.Message{m})
	require.Equal(t, relay.ReasonReservedHeader, relay.ReasonOf(errs[0]), "%v", errs[0])
	r, err := p.Routing("")
	require.NoError(t, err)
	require.True(t, r.(routing.Webhook).CloudEvents)
}
