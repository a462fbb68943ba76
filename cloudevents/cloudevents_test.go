package cloudevents_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/cloudevents"
)

func TestAttributes(t *testing.T) {
	t.Parallel()
	c := cloudevents.Config{Source: "urn:outbox:orders"}
	at := time.Date(2026, 1, 2, 3, 4, 5, 600, time.FixedZone("CET", 3600))
	got := c.Attributes(cloudevents.Event{ID: 42, Type: "order.placed", Subject: "s", Time: at, Version: "3"})
	require.Equal(t, []cloudevents.Attribute{
		{Name: "specversion", Value: "1.0"}, {Name: "id", Value: "42"}, {Name: "source", Value: "urn:outbox:orders"},
		{Name: "type", Value: "order.placed"}, {Name: "subject", Value: "s"}, {Name: "time", Value: "2026-01-02T02:04:05.0000006Z"},
		{Name: "datacontenttype", Value: "application/json"}, {Name: "dataschema", Value: "urn:outbox:contract:order.placed:v3"},
	}, got)
	got = c.Attributes(cloudevents.Event{ID: 1, Type: "t"})
	require.Len(t, got, 6, "no time, no dataschema")
	c.DataSchema = "https://example.com/c/"
	require.Equal(t, "https://example.com/c/a%20b/v2.schema.json", c.DataSchemaOf("a b", 2))
}

func TestBindings(t *testing.T) {
	t.Parallel()
	attrs := []cloudevents.Attribute{{Name: "id", Value: "1"}, {Name: "type", Value: `a "b" 100% é`}, {Name: "datacontenttype", Value: "application/json"}}
	require.Equal(t, []cloudevents.Attribute{{Name: "ce_id", Value: "1"}, {Name: "ce_type", Value: `a "b" 100% é`}}, cloudevents.Kafka.Headers(attrs))
	require.Equal(t, []cloudevents.Attribute{{Name: "ce-id", Value: "1"}, {Name: "ce-type", Value: "a%20%22b%22%20100%25%20%C3%A9"}, {Name: "ce-datacontenttype", Value: "application/json"}},
		cloudevents.NATS.Headers(attrs))
	require.Len(t, cloudevents.HTTP.Headers(attrs), 2)
	require.Equal(t, "cloudEvents_id", cloudevents.AMQP.Headers(attrs)[0].Name)
	h := cloudevents.Kafka.With(attrs, map[string]string{"ce_id": "forged", "x": "y"})
	require.Equal(t, map[string]string{"ce_id": "1", "ce_type": `a "b" 100% é`, "x": "y"}, h)
}

// MaxAttributes is at least as long, in every binding, as the attributes
// of any event a valid Config makes.
func TestMaxAttributesBoundsEveryEvent(t *testing.T) {
	t.Parallel()
	esc := strings.Repeat("%25", 66) // the most percent-encoding grows
	c := cloudevents.Config{Source: esc + "ab", DataSchema: "https://x/" + esc[:186] + "/"}
	require.NoError(t, c.Validate())
	e := cloudevents.Event{ID: 1<<63 - 1, Type: "ty pé", Subject: strings.Repeat("f", 36), Time: time.Date(9999, 12, 31, 23, 59, 59, 123456789, time.UTC), Version: "9223372036854775807"}
	for _, b := range []cloudevents.Binding{cloudevents.Kafka, cloudevents.NATS, cloudevents.HTTP, cloudevents.AMQP} {
		size := func(attrs []cloudevents.Attribute) int {
			n := 0
			for _, h := range b.Headers(attrs) {
				n += len(h.Name) + len(h.Value)
			}
			return n
		}
		require.GreaterOrEqual(t, size(cloudevents.MaxAttributes(e.Type)), size(c.Attributes(e)), b.Prefix)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"urn:outbox:a", "/outbox/a", "https://example.com/x?y=1", "a%20b"} {
		require.NoError(t, cloudevents.Config{Source: ok}.Validate(), ok)
	}
	for _, bad := range []string{"", "a b", "é", "a\nb", "a{b}", strings.Repeat("a", 201)} {
		require.Error(t, cloudevents.Config{Source: bad}.Validate(), bad)
	}
	require.Equal(t, "urn:outbox:test%2Fpublic.events_outbox", cloudevents.DefaultSource("test/public.events_outbox"))
	require.NoError(t, cloudevents.Config{Source: cloudevents.DefaultSource("orders eu/é")}.Validate(), "DefaultSource makes a valid source of any name")
}
