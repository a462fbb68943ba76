package redispub_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/redispub"
)

// readWithPython reads a stream back with redis-py (Debian's
// python3-redis) through a consumer group, and prints each entry's
// fields hex-encoded, so that the comparison is byte for byte.
const readWithPython = `
import json, sys, redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), decode_responses=False)
stream = sys.argv[3]
r.xgroup_create(stream, "py", id="0")
out = []
for _, entries in r.xreadgroup("py", "reader", {stream: ">"}, count=1000):
    for entry_id, fields in entries:
        out.append({k.hex(): v.hex() for k, v in fields.items()})
        r.xack(stream, "py", entry_id)
print(json.dumps(out))
`

// A client the project did not write reads what the Publisher added, each
// field byte for byte: redis-py's XREADGROUP.
func TestPythonRedisReadsBack(t *testing.T) {
	t.Parallel()
	if exec.Command("/usr/bin/python3", "-c", "import redis").Run() != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3-redis is not installed; .ci/run installs it")
		}
		t.Skip("python3-redis is not installed (apt-get install python3-redis)")
	}
	s := startPrivate(t)
	p, err := redispub.New(s.client(), redispub.Config{Source: "shop-eu"})
	require.NoError(t, err)
	agg := uuid.New()
	m := []relay.Message{
		{ID: 7, AggregateID: agg, Type: "order.placed", Topic: "order", Payload: []byte(`{"name": "Zoë — 東京 🚀", "q": "\" \\ \u0001"}`),
			Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "ключ": "значение", "empty": ""}},
		{ID: 8, AggregateID: agg, Type: "order.paid", Topic: "order", Payload: []byte(`{}`)},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, err := range p.Publish(ctx, m) {
		require.NoError(t, err)
	}
	host, port := "127.0.0.1", strconv.Itoa(s.port)
	out, err := exec.CommandContext(ctx, "/usr/bin/python3", "-c", readWithPython, host, port, "order").Output()
	require.NoError(t, err, "%s", out)
	var entries []map[string]string
	require.NoError(t, json.Unmarshal(out, &entries))
	require.Len(t, entries, 2)
	for i, e := range entries {
		got := map[string]string{}
		for k, v := range e {
			kb, _ := hex.DecodeString(k)
			vb, _ := hex.DecodeString(v)
			got[string(kb)] = string(vb)
		}
		want := map[string]string{
			"event_id": strconv.FormatInt(m[i].ID, 10), "event_type": m[i].Type, "aggregate_id": agg.String(),
			"content-type": "application/json", "event_source": "shop-eu", "payload": string(m[i].Payload),
		}
		for k, v := range m[i].Headers {
			want["header:"+k] = v
		}
		require.Equal(t, want, got, "entry %d as redis-py reads it", i)
	}
}
