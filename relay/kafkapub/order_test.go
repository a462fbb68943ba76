package kafkapub_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// clientKinds are the publisher clients the ordering tests run on: a
// publisher's own, and one several publishers share.
var clientKinds = []struct {
	name      string
	newClient func(kafka.ClientConfig) (*kgo.Client, error)
}{
	{"own client", kafkapub.NewPublisherClient},
	{"shared client", kafkapub.NewSharedPublisherClient},
}

// One aggregate's records fill many produce requests to its partition
// (a small batch limit). The broker refuses, for good, the request that
// carries one of them: no later record of the aggregate may be
// acknowledged, on a publisher's own client or on a shared one, where
// records go out as they are produced. With several requests in flight
// to a partition, the broker accepted the next request after refusing
// one, and a later event landed ahead of an earlier one it kept waiting.
func TestRefusedRequestLetsNoLaterRecordOfItsAggregateThrough(t *testing.T) {
	t.Parallel()
	for _, tc := range clientKinds {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := devkafka.Start(devkafka.Config{Partitions: 1, MaxMessageBytes: 4_000})
			require.NoError(t, err)
			t.Cleanup(b.Close)
			cl, err := tc.newClient(kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{
				kgo.RecordDeliveryTimeout(5 * time.Second), kgo.ProducerBatchCompression(kgo.NoCompression()),
			}})
			require.NoError(t, err)
			t.Cleanup(cl.Close)
			pub := kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{})
			agg := uuid.New()
			var batch []relay.Message
			for i := range 200 {
				batch = append(batch, msg(int64(i+1), agg, "order", 300))
			}
			refused := int64(60)
			b.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Topic: "order", Err: kerr.InvalidRecord, When: carries(refused)})
			errs := pub.Publish(context.Background(), batch)
			for i, m := range batch {
				switch {
				case m.ID < refused:
					require.NoError(t, errs[i], "record %d comes before the refused one", m.ID)
				case m.ID == refused:
					require.True(t, relay.IsPermanent(errs[i]), "record %d is to blame: %v", m.ID, errs[i])
				default:
					require.Error(t, errs[i], "record %d was acknowledged after record %d of its aggregate was refused", m.ID, refused)
				}
			}
		})
	}
}

// The first batch to a topic the client does not know yet: its records
// wait for the topic's metadata, then the client puts them in their
// partitions' buffers one by one. A Flush running meanwhile sends the
// first few at once; when the broker refuses that request for good, the
// client fails only what the buffers held then, and the rest, sent later,
// can be acknowledged behind refused records of their aggregates (seen in
// CI, under load). So the publisher starts its Flush only once every
// record is in its buffer: the client's "flushing" log line comes after
// the last record was partitioned, at every Flush.
func TestFlushStartsOnceEveryRecordIsPartitioned(t *testing.T) {
	t.Parallel()
	for _, tc := range clientKinds {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := devkafka.Start(devkafka.Config{Partitions: 6})
			require.NoError(t, err)
			t.Cleanup(b.Close)
			w := &flushWatch{}
			cl, err := tc.newClient(kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{
				kgo.RecordDeliveryTimeout(10 * time.Second), kgo.WithHooks(w), kgo.WithLogger(w),
			}})
			require.NoError(t, err)
			t.Cleanup(cl.Close)
			pub := kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{})
			var batch []relay.Message
			for i := range 600 {
				batch = append(batch, msg(int64(i+1), uuid.New(), "fresh", 100))
			}
			for _, err := range pub.Publish(context.Background(), batch) {
				require.NoError(t, err)
			}
			flushes := w.flushes()
			require.NotEmpty(t, flushes)
			require.Equal(t, int64(600), flushes[0].produced, "the batch was produced before the first Flush")
			for _, f := range flushes {
				// The client calls its hooks one after the other, the
				// publisher's (which lets the Flush start) before this
				// test's: the last record may be counted here a moment
				// after the Flush began. A record sent again (a retry) is
				// partitioned again. So: all but that one at least.
				require.GreaterOrEqual(t, f.partitioned+1, f.produced, "records partitioned when a Flush began, of those produced: %+v", flushes)
			}
		})
	}
}

// flushWatch counts the records produced into a client and those it
// partitioned, and notes both at each "flushing" line the client logs.
type flushWatch struct {
	produced, partitioned atomic.Int64
	mu                    sync.Mutex
	atFlush               []flushCounts
}

type flushCounts struct{ produced, partitioned int64 }

func (w *flushWatch) OnProduceRecordBuffered(*kgo.Record) { w.produced.Add(1) }

func (w *flushWatch) OnProduceRecordPartitioned(*kgo.Record, int32) { w.partitioned.Add(1) }

func (w *flushWatch) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (w *flushWatch) Log(_ kgo.LogLevel, msg string, _ ...any) {
	if msg == "flushing" {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.atFlush = append(w.atFlush, flushCounts{w.produced.Load(), w.partitioned.Load()})
	}
}

func (w *flushWatch) flushes() []flushCounts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.atFlush)
}

// The client partitions a new topic's records a moment before it stores
// the topic's partitions, where a Flush finds what to drain: a Flush
// started in that moment misses them. A hook that holds the client there
// (sleeping on the last record) makes the moment long: the publisher's
// Flush starts again and every record is acknowledged.
func TestFlushStartedBeforeANewTopicIsStoredStillDelivers(t *testing.T) {
	t.Parallel()
	b, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	slow := &slowLastPartition{n: 10, pause: 500 * time.Millisecond}
	cl, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{
		kgo.RecordDeliveryTimeout(10 * time.Second), kgo.WithHooks(slow),
	}})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	pub := kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{})
	var batch []relay.Message
	for i := range slow.n {
		batch = append(batch, msg(int64(i+1), uuid.New(), "late", 100))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, err := range pub.Publish(ctx, batch) {
		require.NoError(t, err, "record %d", i+1)
	}
}

// slowLastPartition sleeps in the client when it partitions its n-th
// record.
type slowLastPartition struct {
	n     int64
	pause time.Duration
	seen  atomic.Int64
}

func (s *slowLastPartition) OnProduceRecordPartitioned(*kgo.Record, int32) {
	if s.seen.Add(1) == s.n {
		time.Sleep(s.pause)
	}
}
