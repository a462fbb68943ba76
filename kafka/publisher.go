package kafka

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/relay"
)

// Header names the relayer sets on every record.
const (
	HeaderEventID     = "event_id"
	HeaderEventType   = "event_type"
	HeaderContentType = "content-type"
	// HeaderEventSource names the outbox a record came from, when the
	// publisher is given a Source. event_id is unique only within one
	// outbox; consumers make (source, event_id) their dedupe key.
	HeaderEventSource = "event_source"
)

// Defaults for producer options that matter to the relayer.
const (
	// DefaultDeliveryTimeout bounds how long a batch waits for the broker
	// before the relayer rolls it back and backs off.
	DefaultDeliveryTimeout = 30 * time.Second
	// DefaultMaxMessageBytes is Kafka's default message.max.bytes.
	DefaultMaxMessageBytes = 1048588
)

// ProducerOptions are the franz-go options the relayer's client needs:
// idempotent writes (on by default in franz-go: retries keep per-partition
// order), the murmur2 key partitioner Kafka's Java client uses, no linger
// (the relayer hands over whole batches and waits), a bounded delivery
// timeout so an outage surfaces as an error, a batch limit that matches
// Kafka's default message.max.bytes, and a request for topic auto-creation
// (what the Java producer asks for by default; the broker's
// auto.create.topics.enable decides).
func ProducerOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.AllowAutoTopicCreation(),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(DefaultDeliveryTimeout),
		// Without this, a record already written to a connection that then
		// dies is never timed out (the client cannot know whether the broker
		// stored it) and the batch waits for the broker to come back,
		// holding its transaction open with no error to count or log. The
		// relayer is at-least-once anyway: it rolls the batch back and sends
		// it again, and a possible duplicate is what consumers dedupe.
		kgo.AllowIdempotentProduceCancellation(),
		kgo.ProducerBatchMaxBytes(DefaultMaxMessageBytes),
		kgo.UnknownTopicRetries(3),
		kgo.MaxBufferedRecords(100_000),
	}
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Source, when set, goes into every record's event_source header.
	// Defaults to "" (no header).
	Source string
}

// Publisher is a relay.Publisher on a franz-go client. The client should
// be built with ProducerOptions (NewPublisherClient does that).
type Publisher struct {
	client *kgo.Client
	source string
}

// NewPublisher wraps client.
func NewPublisher(client *kgo.Client, cfg PublisherConfig) *Publisher {
	return &Publisher{client: client, source: cfg.Source}
}

// NewPublisherClient builds a franz-go client for publishing from cfg.
func NewPublisherClient(cfg ClientConfig) (*kgo.Client, error) {
	opts, err := cfg.Options()
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(append(ProducerOptions(), kgo.ManualFlushing()), opts...)...)
}

// Record builds the Kafka record for one outbox message.
func Record(m relay.Message, source string) *kgo.Record {
	hdrs := make([]kgo.RecordHeader, 0, 4+len(m.Headers))
	hdrs = append(hdrs,
		kgo.RecordHeader{Key: HeaderEventID, Value: strconv.AppendInt(nil, m.ID, 10)},
		kgo.RecordHeader{Key: HeaderEventType, Value: []byte(m.Type)},
		kgo.RecordHeader{Key: HeaderContentType, Value: []byte("application/json")},
	)
	if source != "" {
		hdrs = append(hdrs, kgo.RecordHeader{Key: HeaderEventSource, Value: []byte(source)})
	}
	if len(m.Headers) > 0 {
		keys := make([]string, 0, len(m.Headers))
		for k := range m.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			hdrs = append(hdrs, kgo.RecordHeader{Key: k, Value: []byte(m.Headers[k])})
		}
	}
	// No Timestamp: franz-go stamps the produce time. It measures
	// RecordDeliveryTimeout from the record's timestamp and fails, unsent,
	// a record older than that; stamping created_at made every row older
	// than the timeout (a backlog after any outage) unpublishable forever.
	return &kgo.Record{
		Topic:   m.Topic,
		Key:     []byte(m.AggregateID.String()),
		Value:   m.Payload,
		Headers: hdrs,
	}
}

// Publish buffers every record of msgs, then flushes and waits for every
// acknowledgement. Buffering the whole batch first keeps per-aggregate
// order when a produce request fails for good: franz-go then fails every
// record it holds for that partition and starts the partition afresh, so a
// record appended after the failure would be written ahead of its failed
// predecessors. That needs a client with kgo.ManualFlushing, as
// NewPublisherClient builds; on other clients Publish works without the
// protection.
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	wg.Add(len(msgs))
	for i, m := range msgs {
		p.client.Produce(ctx, Record(m, p.source), func(_ *kgo.Record, err error) {
			if err != nil {
				errs[i] = Classify(err)
			}
			wg.Done()
		})
	}
	if err := p.client.Flush(ctx); err != nil {
		// Not sent yet: fail them now, or the next Flush would send them
		// behind the relayer's back.
		p.client.AbortBufferedRecords(context.WithoutCancel(ctx)) //nolint:errcheck // waits for in-flight requests
	}
	wg.Wait()
	return errs
}

// Classify wraps errors that retrying cannot fix with relay.Permanent.
func Classify(err error) error {
	for _, perm := range []error{
		kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTopicException,
		kerr.TopicAuthorizationFailed, kerr.InvalidRecord, kerr.UnknownTopicOrPartition,
		kerr.PolicyViolation,
	} {
		if errors.Is(err, perm) {
			return relay.Permanent(err)
		}
	}
	return err
}
