package amqppub_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/amqppub"
)

// pikaRead takes n messages from a queue with pika, RabbitMQ's Python
// client, and prints each as JSON: its properties, its headers and its
// body in base64, so the comparison is byte for byte.
const pikaRead = `
import base64, json, sys, pika
url, queue, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
conn = pika.BlockingConnection(pika.URLParameters(url))
ch = conn.channel()
got = 0
for method, props, body in ch.consume(queue, inactivity_timeout=30):
    if method is None:
        sys.exit("pika: only %d of %d messages came" % (got, n))
    headers = {k: (v.decode("utf-8") if isinstance(v, bytes) else v) for k, v in (props.headers or {}).items()}
    print(json.dumps({"routing_key": method.routing_key, "message_id": props.message_id, "type": props.type,
        "content_type": props.content_type, "delivery_mode": props.delivery_mode, "headers": headers,
        "body": base64.b64encode(body).decode()}))
    ch.basic_ack(method.delivery_tag)
    got += 1
    if got == n:
        break
conn.close()
`

// What the publisher sends reads back byte for byte with pika, a client
// the project did not write: the body, every header (the relayer's and
// the row's own, non-ASCII ones among them), message_id, type,
// content-type and persistence.
func TestReadBackWithPika(t *testing.T) {
	t.Parallel()
	if err := exec.Command("/usr/bin/python3", "-c", "import pika").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3-pika is not installed; .ci/run installs it")
		}
		t.Skip("python3-pika is not installed (apt-get install python3-pika)")
	}
	pub, q := bound(t, rabbittest.URL(), amqppub.Config{Source: "shop-db"})
	agg := uuid.New()
	msgs := []relay.Message{
		{ID: 101, AggregateID: agg, Type: "order.placed", Topic: q, Payload: []byte(`{"name": "Zoë — 東京 🚀", "html": "<b>a & b</b>", "n": 1.50}`),
			Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "ключ": "значение", "empty": ""}},
		{ID: 102, AggregateID: agg, Type: "order.paid", Topic: q, Payload: []byte(`{}`)},
	}
	for i, err := range pub.Publish(context.Background(), msgs) {
		require.NoError(t, err, msgs[i].ID)
	}
	out, err := exec.Command("/usr/bin/python3", "-c", pikaRead, rabbittest.URL(), q, strconv.Itoa(len(msgs))).Output()
	require.NoError(t, err, "pika: %s", stderr(err))
	dec := json.NewDecoder(bytes.NewReader(out))
	for _, m := range msgs {
		var got struct {
			RoutingKey   string            `json:"routing_key"`
			MessageID    string            `json:"message_id"`
			Type         string            `json:"type"`
			ContentType  string            `json:"content_type"`
			DeliveryMode int               `json:"delivery_mode"`
			Headers      map[string]string `json:"headers"`
			Body         string            `json:"body"`
		}
		require.NoError(t, dec.Decode(&got), "pika printed %s", out)
		body, err := base64.StdEncoding.DecodeString(got.Body)
		require.NoError(t, err)
		require.Equal(t, string(m.Payload), string(body))
		want := map[string]string{outbox.HeaderEventID: strconv.FormatInt(m.ID, 10), outbox.HeaderEventType: m.Type,
			outbox.HeaderAggregateID: agg.String(), outbox.HeaderEventSource: "shop-db"}
		for k, v := range m.Headers {
			want[k] = v
		}
		require.Equal(t, want, got.Headers)
		require.Equal(t, strconv.FormatInt(m.ID, 10), got.MessageID)
		require.Equal(t, m.Type, got.Type)
		require.Equal(t, q, got.RoutingKey)
		require.Equal(t, outbox.ContentTypeJSON, got.ContentType)
		require.Equal(t, 2, got.DeliveryMode, "persistent")
	}
}

func stderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
