package natspub_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/natspub"
	"github.com/pgoutbox/outbox/routing"
)

// With CloudEvents on, every message carries the attributes as ce-
// headers, values percent-encoded as the NATS binding asks, next to the
// outbox's own headers; an event header cannot forge one.
func TestCloudEventsNATSBinaryMode(t *testing.T) {
	t.Parallel()
	b := setup(t, natspub.Config{Source: "orders-db", CloudEvents: &cloudevents.Config{Source: "urn:outbox:orders-db"}},
		jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"order.>"}})
	agg := uuid.New()
	created := time.Date(2026, 3, 1, 12, 30, 45, 5, time.UTC)
	m1 := msg(3, agg, "order.placé", `{"total": 1}`)
	m1.CreatedAt, m1.Headers = created, map[string]string{outbox.HeaderEventVersion: "1", "ce-id": "forged"}
	m2 := msg(4, agg, "order.shipped", `{}`)
	for _, err := range publish(t, b.pub, m1, m2) {
		require.NoError(t, err)
	}
	got := natstest.ReadStream(t, b.js, "ORDERS", "")
	require.Len(t, got, 2)
	h := got[0].Header
	dec := func(name string) string {
		v, err := url.PathUnescape(h.Get(name))
		require.NoError(t, err)
		return v
	}
	require.Equal(t, "order.plac%C3%A9", h.Get("ce-type"), "percent-encoded")
	require.Equal(t, "order.placé", dec("ce-type"))
	require.Equal(t, "1.0", dec("ce-specversion"))
	require.Equal(t, "3", h.Get("ce-id"))
	require.Equal(t, "urn:outbox:orders-db", dec("ce-source"))
	require.Equal(t, agg.String(), dec("ce-subject"))
	require.Equal(t, "2026-03-01T12:30:45.000000005Z", dec("ce-time"))
	require.Equal(t, "application/json", dec("ce-datacontenttype"), "NATS's binding keeps content-type for structured mode")
	require.Equal(t, "urn:outbox:contract:order.plac%25C3%25A9:v1", h.Get("ce-dataschema"))
	require.Equal(t, "3", h.Get(outbox.HeaderEventID))
	require.Equal(t, "orders-db:3", h.Get(routing.HeaderNATSMsgID))
	require.Equal(t, "4", got[1].Header.Get("ce-id"))
	require.Empty(t, got[1].Header.Get("ce-dataschema"))
	require.Empty(t, got[1].Header.Get("ce-time"), "no created_at, no time")
}

// The CloudEvents headers count in a message's size: one that fits the
// stream without them is refused as too large with them, and
// routing.NATS with CloudEvents counts at least as much as the relayer
// sends.
func TestCloudEventsNATSSize(t *testing.T) {
	t.Parallel()
	ce := &cloudevents.Config{Source: "urn:outbox:" + strings.Repeat("s", 150)}
	m := msg(1<<40, uuid.New(), "order.placed", `{"a":1}`)
	m.CreatedAt, m.Headers = time.Now(), map[string]string{outbox.HeaderEventVersion: "3"}
	plain := routing.NATS{}.MessageSize(m.ID, m.Type, len(m.Payload), m.Headers, "")
	with := routing.NATS{}.MessageSize(m.ID, m.Type, len(m.Payload), cloudevents.NATS.With(ce.Attributes(m.CloudEvent()), m.Headers), "")
	require.Greater(t, with, plain+250)
	require.GreaterOrEqual(t, routing.NATS{CloudEvents: true}.Size(m.Type, len(m.Payload), m.Headers), with)

	b := setup(t, natspub.Config{CloudEvents: ce, MaxPayloadBytes: plain + 10},
		jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"order.>"}})
	errs := publish(t, b.pub, m)
	require.Equal(t, relay.ReasonTooLarge, relay.ReasonOf(errs[0]), "%v", errs[0])
	r, err := b.pub.Routing("")
	require.NoError(t, err)
	require.Equal(t, routing.NATS{CloudEvents: true}, r)
	_, err = natspub.New(nil, natspub.Config{})
	require.Error(t, err)
	require.ErrorContains(t, natspub.Config{CloudEvents: &cloudevents.Config{Source: "a b"}}.Validate(), "natspub: CloudEvents: cloudevents: Source \"a b\" is not a URI-reference")
}
