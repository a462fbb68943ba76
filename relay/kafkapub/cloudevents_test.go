package kafkapub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/cetest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// ceBroker starts a dev broker and a publisher on it that stamps
// CloudEvents attributes (source ce).
func ceBroker(t *testing.T, ce *cloudevents.Config, maxMessage int) (*kafkapub.Publisher, *devkafka.Broker) {
	t.Helper()
	b, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	cl, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	cfg := kafkapub.PublisherConfig{Source: "orders-db", CloudEvents: ce, MaxMessageBytes: maxMessage}
	require.NoError(t, cfg.Validate())
	return kafkapub.NewPublisher(cl, cfg), b
}

// kcatJSON reads topic from its start with kcat (librdkafka) and returns
// each record's key, payload and headers.
func kcatJSON(t *testing.T, broker, topic string) []cetest.Message {
	t.Helper()
	path, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kcat is not on PATH; CI must install it (apt-get install kcat)")
		}
		t.Skip("kcat is not on PATH; install it (apt-get install kcat) to read the CloudEvents headers with librdkafka")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "-C", "-b", broker, "-t", topic, "-o", "beginning", "-e", "-q", "-J")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "kcat: %s", stderr.String())
	var out []cetest.Message
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var r struct {
			Key     string          `json:"key"`
			Payload string          `json:"payload"`
			Headers json.RawMessage `json:"headers"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		h := map[string]string{}
		if len(r.Headers) > 0 && r.Headers[0] == '{' {
			require.NoError(t, json.Unmarshal(r.Headers, &h))
		} else {
			var flat []string
			require.NoError(t, json.Unmarshal(r.Headers, &flat))
			for i := 0; i+1 < len(flat); i += 2 {
				h[flat[i]] = flat[i+1]
			}
		}
		out = append(out, cetest.Message{Binding: "kafka", Headers: h, Body: r.Payload, Key: r.Key})
	}
	return out
}

// With CloudEvents on, every record carries the attributes in Kafka's
// binary mode; librdkafka (kcat) reads the headers as sent, and the npm
// CloudEvents SDK parses each record into a valid event whose id, source,
// type, subject, time, dataschema and data are the outbox event's.
func TestCloudEventsKafkaBinaryMode(t *testing.T) {
	t.Parallel()
	sdk := cetest.SDK(t)
	ce := &cloudevents.Config{Source: "urn:outbox:orders-db"}
	pub, b := ceBroker(t, ce, 0)
	agg := uuid.New()
	created := time.Date(2026, 3, 1, 12, 30, 45, 123456789, time.UTC)
	msgs := []relay.Message{
		{ID: 7, AggregateID: agg, Type: "order.placed", Topic: "order", Payload: []byte(`{"total": 12.5, "name": "Zoë 東京"}`),
			Headers: map[string]string{outbox.HeaderEventVersion: "2", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, CreatedAt: created},
		{ID: 8, AggregateID: agg, Type: "order.shipped", Topic: "order", Payload: []byte(`{}`), CreatedAt: created.Add(time.Second),
			Headers: map[string]string{"ce_id": "forged", "ce_partner": "acme"}},
	}
	for _, err := range pub.Publish(context.Background(), msgs) {
		require.NoError(t, err)
	}
	got := kcatJSON(t, b.Addr(), "order")
	require.Len(t, got, 2)
	h := got[0].Headers
	require.Equal(t, "1.0", h["ce_specversion"])
	require.Equal(t, "7", h["ce_id"])
	require.Equal(t, "urn:outbox:orders-db", h["ce_source"])
	require.Equal(t, "order.placed", h["ce_type"])
	require.Equal(t, agg.String(), h["ce_subject"])
	require.Equal(t, "2026-03-01T12:30:45.123456789Z", h["ce_time"])
	require.Equal(t, "urn:outbox:contract:order.placed:v2", h["ce_dataschema"])
	require.Equal(t, "application/json", h["content-type"])
	require.NotContains(t, h, "ce_datacontenttype", "Kafka's binding carries it in content-type")
	require.Equal(t, "7", h[outbox.HeaderEventID], "the outbox's own headers stay")
	require.Equal(t, "8", got[1].Headers["ce_id"], "an event header cannot forge an attribute")
	require.NotContains(t, got[1].Headers, "ce_dataschema", "no version, no dataschema")

	res := sdk(got)
	for i, r := range res {
		require.Empty(t, r.Error, "the SDK refused record %d: %+v", i, got[i])
	}
	e := res[0].Event
	require.Equal(t, "7", e["id"])
	require.Equal(t, "urn:outbox:orders-db", e["source"])
	require.Equal(t, "order.placed", e["type"])
	require.Equal(t, agg.String(), e["subject"])
	require.Equal(t, "1.0", e["specversion"])
	require.Equal(t, "application/json", e["datacontenttype"])
	require.Equal(t, "urn:outbox:contract:order.placed:v2", e["dataschema"])
	require.Equal(t, "2026-03-01T12:30:45.123Z", e["time"])
	require.Equal(t, map[string]any{"total": 12.5, "name": "Zoë 東京"}, e["data"])
	require.Equal(t, "acme", res[1].Event["partner"], "an event's own ce_ header reads as an extension")
}

// The CloudEvents headers count in a record's size: a record that fits
// the topic without them is refused as too large with them, before it is
// sent, and KafkaRouting with CloudEvents counts at least as much as the
// relayer sends, so Emit refuses what the relayer would.
func TestCloudEventsKafkaSize(t *testing.T) {
	t.Parallel()
	ce := &cloudevents.Config{Source: "urn:outbox:" + strings.Repeat("s", 150), DataSchema: "https://example.com/" + strings.Repeat("c", 150) + "/"}
	m := relay.Message{ID: 1 << 40, AggregateID: uuid.New(), Type: "order.placed", Topic: "order", Payload: []byte(`{"a":1}`),
		Headers: map[string]string{outbox.HeaderEventVersion: "12"}, CreatedAt: time.Now()}
	plain := outbox.KafkaRouting{}.RecordSize(m.ID, m.Type, len(m.Payload), m.Headers, "orders-db")
	with := outbox.KafkaRouting{}.RecordSize(m.ID, m.Type, len(m.Payload), cloudevents.Kafka.With(ce.Attributes(m.CloudEvent()), m.Headers), "orders-db")
	require.Greater(t, with, plain+300)
	worst := outbox.KafkaRouting{CloudEvents: true}.Size(m.Type, len(m.Payload), m.Headers)
	require.GreaterOrEqual(t, worst, with)
	require.Less(t, outbox.KafkaRouting{}.Size(m.Type, len(m.Payload), m.Headers), worst)

	pub, _ := ceBroker(t, ce, plain+10)
	errs := pub.Publish(context.Background(), []relay.Message{m})
	require.Equal(t, relay.ReasonTooLarge, relay.ReasonOf(errs[0]), "%v", errs[0])
	require.Contains(t, errs[0].Error(), "the record is "+strconv.Itoa(with)+" bytes")
	r, err := pub.Routing("")
	require.NoError(t, err)
	require.Equal(t, outbox.KafkaRouting{CloudEvents: true}, r, "producers must size for the headers the relayer adds")
}

// A CloudEvents config the publisher cannot use is refused by name.
func TestCloudEventsKafkaConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ce   cloudevents.Config
		want string
	}{
		{cloudevents.Config{}, "Source is empty"},
		{cloudevents.Config{Source: "orders db"}, "not a URI-reference"},
		{cloudevents.Config{Source: strings.Repeat("a", 201)}, "at most 200"},
		{cloudevents.Config{Source: "urn:x", DataSchema: "relative/"}, "absolute URI ending in '/'"},
		{cloudevents.Config{Source: "urn:x", DataSchema: "https://example.com/c"}, "absolute URI ending in '/'"},
	} {
		err := kafkapub.PublisherConfig{CloudEvents: &tc.ce}.Validate()
		require.ErrorContains(t, err, tc.want, "%+v", tc.ce)
		require.ErrorContains(t, err, "kafkapub: CloudEvents:")
	}
	require.NoError(t, kafkapub.PublisherConfig{CloudEvents: &cloudevents.Config{Source: "/outbox/orders", DataSchema: "https://example.com/contracts/"}}.Validate())
}
