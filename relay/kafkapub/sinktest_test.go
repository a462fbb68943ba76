package kafkapub_test

import (
	"encoding/binary"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay/kafkapub"
	"github.com/pgoutbox/outbox/relay/sinktest"
)

// sinkMaxBytes is the dev broker's message.max.bytes in the suite.
const sinkMaxBytes = 100_000

// The Kafka publisher passes the sink suite on the dev broker, with every
// fault the suite can inject: a partition without enough replicas (a
// retry may fix it), a topic the client may not write, and a broker that
// refuses any record batch holding one record (as it refuses a corrupt
// one), which the publisher narrows down to that record.
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "kafka", New: kafkaSink(kafkapub.PublisherConfig{})})
}

// With CloudEvents headers stamped, the publisher passes the same suite:
// they change neither what arrives of the event nor how failures are
// attributed.
func TestSinkConformanceCloudEvents(t *testing.T) {
	t.Parallel()
	cfg := kafkapub.PublisherConfig{Source: "conformance", CloudEvents: &cloudevents.Config{Source: "urn:outbox:conformance"}}
	sinktest.Run(t, sinktest.Harness{Name: "kafka-cloudevents", New: kafkaSink(cfg)})
}

// On a client shared by several outboxes' publishers, which waits for
// its own records instead of flushing the client, it passes the suite
// too. Not in parallel with the other suites of this package: a third
// set of brokers at once made their fault cases time out under CI's load.
func TestSinkConformanceSharedClient(t *testing.T) {
	sinktest.Run(t, sinktest.Harness{Name: "kafka-shared", New: func(t *testing.T) *sinktest.Sink {
		return kafkaSinkOn(t, kafkapub.PublisherConfig{}, kafkapub.NewSharedPublisherClient)
	}})
}

func kafkaSink(cfg kafkapub.PublisherConfig) func(t *testing.T) *sinktest.Sink {
	return func(t *testing.T) *sinktest.Sink { return kafkaSinkWith(t, cfg) }
}

func kafkaSinkWith(t *testing.T, cfg kafkapub.PublisherConfig) *sinktest.Sink {
	t.Helper()
	return kafkaSinkOn(t, cfg, kafkapub.NewPublisherClient)
}

func kafkaSinkOn(t *testing.T, cfg kafkapub.PublisherConfig, newClient func(kafka.ClientConfig) (*kgo.Client, error)) *sinktest.Sink {
	t.Helper()
	b, err := devkafka.Start(devkafka.Config{Partitions: 3, MaxMessageBytes: sinkMaxBytes})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	// The client's debug log, shown when the case fails: an order the
	// suite finds broken under load is otherwise hard to explain.
	clientLog := &tailBuffer{max: 256 << 10}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the Kafka client's log (last %d bytes):\n%s", clientLog.max, clientLog.String())
		}
	})
	client, err := newClient(kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{
		// A transient fault surfaces as an error after this long.
		kgo.RecordDeliveryTimeout(5 * time.Second),
		// Plain record batches, which the per-record faults read.
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.WithLogger(kgo.BasicLogger(clientLog, kgo.LogLevelDebug, nil)),
	}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	fault := func(f kfake.Fault) func() {
		f.Keys, f.Count = []kmsg.Key{kmsg.Produce}, -1
		return b.Fault(f).Remove
	}
	return &sinktest.Sink{
		Sink: kafkapub.NewPublisher(client, cfg),
		Read: func(t *testing.T, dest string, want int) []sinktest.Delivered {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			enough := kafkatest.AtLeastThenQuiet(want, 250*time.Millisecond)
			var out []sinktest.Delivered
			for _, r := range kafkatest.Read(t, b.Addr(), 20*time.Second, func(rs []*kgo.Record) bool {
				return enough(rs) || time.Now().After(deadline)
			}, dest) {
				h := kafkatest.Headers(r)
				out = append(out, sinktest.Delivered{ID: kafkatest.EventID(r), Key: string(r.Key),
					Type: h[outbox.HeaderEventType], Payload: r.Value, Headers: h})
			}
			return out
		},
		MaxBytes: sinkMaxBytes,
		FailDestination: func(_ *testing.T, dest string) func() {
			return fault(kfake.Fault{Topic: dest, Err: kerr.NotEnoughReplicas})
		},
		RefuseDestination: func(_ *testing.T, dest string) {
			fault(kfake.Fault{Topic: dest, Err: kerr.TopicAuthorizationFailed})
		},
		FailMessage: func(_ *testing.T, dest string, id int64) func() {
			return fault(kfake.Fault{Topic: dest, Err: kerr.NotEnoughReplicas, When: carries(id)})
		},
		RefuseMessage: func(_ *testing.T, dest string, id int64) {
			fault(kfake.Fault{Topic: dest, Err: kerr.InvalidRecord, When: carries(id)})
		},
	}
}

// carries matches a produce request that holds the record with event_id
// id: the broker then fails every partition of the request, and the
// publisher must find the record to blame among them.
func carries(id int64) func(kmsg.Request) bool {
	want := strconv.FormatInt(id, 10)
	return func(req kmsg.Request) bool {
		produce, ok := req.(*kmsg.ProduceRequest)
		if !ok {
			return false
		}
		for _, topic := range produce.Topics {
			for _, p := range topic.Partitions {
				if batchCarries(p.Records, want) {
					return true
				}
			}
		}
		return false
	}
}

// batchCarries reports whether the uncompressed record batch raw holds a
// record whose event_id header is id.
func batchCarries(raw []byte, id string) bool {
	var batch kmsg.RecordBatch
	if batch.ReadFrom(raw) != nil || batch.Attributes&0x07 != 0 {
		return false
	}
	recs := batch.Records
	for range batch.NumRecords {
		length, n := binary.Varint(recs)
		if n <= 0 || n+int(length) > len(recs) {
			return false
		}
		var rec kmsg.Record
		if rec.ReadFrom(recs[:n+int(length)]) != nil {
			return false
		}
		recs = recs[n+int(length):]
		for _, h := range rec.Headers {
			if h.Key == outbox.HeaderEventID && string(h.Value) == id {
				return true
			}
		}
	}
	return false
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
