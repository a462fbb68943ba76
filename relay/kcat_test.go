package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
)

// kcatRecord is one line of kcat -J output.
type kcatRecord struct {
	Topic     string          `json:"topic"`
	Partition int32           `json:"partition"`
	Offset    int64           `json:"offset"`
	Headers   json.RawMessage `json:"headers"`
	Key       *string         `json:"key"`
	Payload   *string         `json:"payload"`
}

// headers decodes kcat's headers, which it prints as an object or, in some
// versions, as a flat [name, value, ...] array.
func (r kcatRecord) headers(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	if len(r.Headers) == 0 {
		return out
	}
	if r.Headers[0] == '{' {
		require.NoError(t, json.Unmarshal(r.Headers, &out))
		return out
	}
	var flat []string
	require.NoError(t, json.Unmarshal(r.Headers, &flat))
	require.Zero(t, len(flat)%2, "kcat headers %s", r.Headers)
	for i := 0; i < len(flat); i += 2 {
		out[flat[i]] = flat[i+1]
	}
	return out
}

func kcatPath(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kcat is not on PATH; CI must install it (apt-get install kcat) for the interop test")
		}
		t.Skip("kcat is not on PATH; install it (apt-get install kcat) to run the librdkafka interop test")
	}
	return path
}

// kcat runs kcat with args and stdin, bounded in time, and returns stdout.
func kcat(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kcatPath(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "kcat %s: %s", strings.Join(args, " "), stderr.String())
	return stdout.String()
}

func kcatConsume(t *testing.T, broker, topic string) []kcatRecord {
	t.Helper()
	out := kcat(t, "", "-C", "-b", broker, "-t", topic, "-o", "beginning", "-e", "-q", "-J")
	var recs []kcatRecord
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var r kcatRecord
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "kcat line %q", sc.Text())
		recs = append(recs, r)
	}
	require.NoError(t, sc.Err())
	return recs
}

// A C client (librdkafka, through kcat) reads what the relayer published:
// keys, headers and payloads as sent, and each aggregate in the partition
// the Java client's murmur2 partitioner picks, so producers in other
// languages keyed by the same aggregate land in the same partition.
func TestKcatReadsRelayedEvents(t *testing.T) {
	t.Parallel()
	kcatPath(t)
	const perAggregate, aggregates = 5, 10
	ctx := context.Background()
	b := setup(t)
	type sent struct {
		agg     uuid.UUID
		typ     string
		payload map[string]any
		trace   string
	}
	want := map[int64]sent{}
	aggs := make([]uuid.UUID, aggregates)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	for n := range perAggregate * aggregates {
		agg := aggs[n%aggregates]
		ev := sent{agg: agg, typ: []string{"order.placed", "order.paid"}[n%2],
			payload: map[string]any{"n": float64(n), "note": "naïve café ✓"}, trace: fmt.Sprintf("trace-%d", n)}
		var id int64
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			id, err = b.producer.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: ev.typ, Payload: ev.payload,
				Headers: map[string]string{"traceparent": ev.trace}})
			return err
		}))
		want[id] = ev
	}
	run(t, b.relayer(t, nil))
	b.waitDrained(t, 20*time.Second)

	recs := kcatConsume(t, b.broker.Addr(), "order")
	require.Len(t, recs, len(want), "kcat should read every event once")
	partOf := map[string]int32{}
	for _, r := range recs {
		h := r.headers(t)
		id, err := strconv.ParseInt(h["event_id"], 10, 64)
		require.NoError(t, err, "event_id header %q", h["event_id"])
		ev, ok := want[id]
		require.True(t, ok, "event %d was not emitted", id)
		require.NotNil(t, r.Key)
		require.Equal(t, ev.agg.String(), *r.Key)
		require.Equal(t, ev.typ, h["event_type"])
		require.Equal(t, "application/json", h["content-type"])
		require.Equal(t, ev.trace, h["traceparent"])
		require.NotNil(t, r.Payload)
		var got map[string]any
		require.NoError(t, json.Unmarshal([]byte(*r.Payload), &got), "payload %q", *r.Payload)
		require.Equal(t, ev.payload, got)
		if p, ok := partOf[*r.Key]; ok {
			require.Equal(t, p, r.Partition, "aggregate %s in two partitions", *r.Key)
		}
		partOf[*r.Key] = r.Partition
	}
	require.Len(t, partOf, aggregates)

	// librdkafka's murmur2 partitioner, on a topic with as many partitions.
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.broker.Addr()))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	details, err := adm.ListTopics(ctx, "order")
	require.NoError(t, err)
	require.NoError(t, details.Error())
	partitions := len(details["order"].Partitions)
	require.Equal(t, 6, partitions, "the dev broker creates topics with devkafka.Config.Partitions (6 in setup)")
	resp, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, "order_keys")
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	var in strings.Builder
	for key := range partOf {
		fmt.Fprintf(&in, "%s:x\n", key)
	}
	kcat(t, in.String(), "-P", "-b", b.broker.Addr(), "-t", "order_keys", "-K:", "-X", "partitioner=murmur2_random")
	theirs := kcatConsume(t, b.broker.Addr(), "order_keys")
	require.Len(t, theirs, len(partOf))
	distinct := map[int32]bool{}
	for _, r := range theirs {
		require.NotNil(t, r.Key)
		require.Equal(t, partOf[*r.Key], r.Partition, "aggregate %s: the relayer chose partition %d, librdkafka's murmur2 chose %d", *r.Key, partOf[*r.Key], r.Partition)
		distinct[r.Partition] = true
	}
	t.Logf("%d events on %d aggregates read by kcat; partitions match librdkafka's murmur2 for every key (%d distinct partitions used)",
		len(recs), len(partOf), len(distinct))
}
