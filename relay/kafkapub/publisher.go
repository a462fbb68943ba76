package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Source, when set, goes into every record's event_source header. Keep
	// it to outbox.MaxSourceLen bytes: Emit sizes events for a source of at
	// most that. Defaults to "" (no header).
	Source string
	// MaxMessageBytes, when positive, is the largest record batch every
	// topic is taken to accept, instead of each topic's max.message.bytes
	// as the broker reports it (read with DescribeConfigs, cached for 5
	// minutes; the broker's message.max.bytes for a topic that sets none).
	// Set it when the relayer may not describe configurations. Defaults to
	// 0 (ask the broker).
	MaxMessageBytes int
}

// Publisher is a relay.Publisher on a franz-go client. The client should
// be built with NewPublisherClient.
//
// A failure belongs to the record that caused it. A record larger than its
// topic accepts is refused before it is sent. When the broker refuses a
// whole produce request (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE,
// INVALID_RECORD apply to a partition's whole batch), its records are sent
// again in halves, down to single records, so that only the culprit fails
// and the records that shared its request go through; records after a
// failed one of their aggregate are not sent, so nothing overtakes it.
type Publisher struct {
	client *kgo.Client
	source string
	limits *topicLimits
}

// NewPublisher wraps client. On a client from NewPublisherClient, produce
// batches are sized per topic by the limits the Publisher learns; on
// another, by that client's ProducerBatchMaxBytes, and requests the broker
// refuses as too large are split as described above.
func NewPublisher(client *kgo.Client, cfg PublisherConfig) *Publisher {
	lim, ok := limitsOf(client)
	if !ok {
		lim = newTopicLimits()
		lim.bind(client)
	}
	lim.mu.Lock()
	lim.override = max(cfg.MaxMessageBytes, 0)
	lim.mu.Unlock()
	return &Publisher{client: client, source: cfg.Source, limits: lim}
}

// NewPublisherClient builds a franz-go client for publishing from cfg:
// kafka.ProducerOptions, manual flushing, and produce batches capped per topic
// at the limit a Publisher on it learns from the broker.
func NewPublisherClient(cfg kafka.ClientConfig) (*kgo.Client, error) {
	opts, err := cfg.Options()
	if err != nil {
		return nil, err
	}
	lim := newTopicLimits()
	opts = append(append(kafka.ProducerOptions(), kgo.ManualFlushing(), kgo.ProducerBatchMaxBytesFn(lim.batchMaxBytes)), opts...)
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	lim.bind(client)
	registerLimits(client, lim)
	return client, nil
}

// Record builds the Kafka record for one outbox message. The message's own
// headers, the trace context Emit wrote (traceparent, tracestate) among
// them, follow the relayer's, sorted by name. They never shadow the
// relayer's: the relayer refuses a row whose headers use a reserved name,
// and Record drops such a header if one gets here anyway.
func Record(m relay.Message, source string) *kgo.Record {
	hdrs := make([]kgo.RecordHeader, 0, 4+len(m.Headers))
	hdrs = append(hdrs,
		kgo.RecordHeader{Key: outbox.HeaderEventID, Value: strconv.AppendInt(nil, m.ID, 10)},
		kgo.RecordHeader{Key: outbox.HeaderEventType, Value: []byte(m.Type)},
		kgo.RecordHeader{Key: outbox.HeaderContentType, Value: []byte(outbox.ContentTypeJSON)},
	)
	if source != "" {
		hdrs = append(hdrs, kgo.RecordHeader{Key: outbox.HeaderEventSource, Value: []byte(source)})
	}
	if len(m.Headers) > 0 {
		keys := make([]string, 0, len(m.Headers))
		for k := range m.Headers {
			if !outbox.IsReservedHeader(k) {
				keys = append(keys, k)
			}
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

// MessagingSystem names Kafka in the relayer's publish spans (see
// relay.MessagingSystem).
func (p *Publisher) MessagingSystem() string { return "kafka" }

// errNotSent marks a record left unsent because an earlier record of its
// aggregate failed in the same batch.
var errNotSent = errors.New("not sent: an earlier record of its aggregate failed")

// Publish refuses the records larger than their topic accepts, sends the
// rest and waits for every acknowledgement, splitting requests the broker
// refuses as a whole (see Publisher).
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := make([]error, len(msgs))
	limits := p.limits.lookup(ctx, topicsOf(msgs))
	var failed map[uuid.UUID]bool
	send := make([]int, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if failed[m.AggregateID] {
			errs[i] = errNotSent
			continue
		}
		lim := limits[m.Topic]
		if size := outbox.RecordSize(m.ID, m.Type, len(m.Payload), m.Headers, p.source); size > lim.bytes {
			errs[i] = relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf(
				"%w: the record is %d bytes (payload %d); topic %q accepts at most %d (%s). Raise the topic's max.message.bytes and retry the row ('outbox events retry'), or park it",
				kerr.MessageTooLarge, size, len(m.Payload), m.Topic, lim.bytes, lim.from))
			if failed == nil {
				failed = map[uuid.UUID]bool{}
			}
			failed[m.AggregateID] = true
			continue
		}
		send = append(send, i)
	}
	p.send(ctx, msgs, send, errs)
	return errs
}

// send produces the records of msgs at idx (ascending), waits for them and
// sets their results in errs. Records of a request the broker refused as a
// whole are sent again in two halves, one after the other, until a single
// record is left to take the error: the culprit.
func (p *Publisher) send(ctx context.Context, msgs []relay.Message, idx []int, errs []error) {
	if len(idx) == 0 {
		return
	}
	var wg sync.WaitGroup
	wg.Add(len(idx))
	for _, i := range idx {
		p.client.Produce(ctx, Record(msgs[i], p.source), func(_ *kgo.Record, err error) {
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
	if len(idx) == 1 || ctx.Err() != nil {
		return
	}
	var again []int
	for _, i := range idx {
		if refusedAsBatch(errs[i]) {
			errs[i] = nil
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return
	}
	again = notBehindFailure(msgs, idx, again, errs)
	half := len(again) / 2
	p.send(ctx, msgs, again[:half], errs)
	p.send(ctx, msgs, notBehindFailure(msgs, again[:half], again[half:], errs), errs)
}

// notBehindFailure returns the records of next whose aggregate has no
// failed record in done; the others are marked not sent. (A record of next
// may also be in done: its own error is nil by then.)
func notBehindFailure(msgs []relay.Message, done, next []int, errs []error) []int {
	var failed map[uuid.UUID]bool
	for _, i := range done {
		if errs[i] != nil {
			if failed == nil {
				failed = map[uuid.UUID]bool{}
			}
			failed[msgs[i].AggregateID] = true
		}
	}
	if failed == nil {
		return next
	}
	out := next[:0:0]
	for _, i := range next {
		if failed[msgs[i].AggregateID] {
			errs[i] = errNotSent
			continue
		}
		out = append(out, i)
	}
	return out
}

// refusedAsBatch reports errors a broker gives a partition's whole record
// batch for what may be one record in it.
func refusedAsBatch(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) || errors.Is(err, kerr.InvalidRecord)
}

func topicsOf(msgs []relay.Message) []string {
	var topics []string
	for i := range msgs {
		if !slices.Contains(topics, msgs[i].Topic) {
			topics = append(topics, msgs[i].Topic)
		}
	}
	return topics
}

// Classify wraps errors that retrying cannot fix with relay.PermanentReason.
func Classify(err error) error {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return relay.PermanentReason(relay.ReasonTooLarge, err)
	case errors.Is(err, kerr.InvalidTopicException), errors.Is(err, kerr.UnknownTopicOrPartition):
		return relay.PermanentReason(relay.ReasonInvalidTopic, err)
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return relay.PermanentReason(relay.ReasonNotAuthorized, err)
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.PolicyViolation):
		return relay.PermanentReason(relay.ReasonBrokerRefused, err)
	}
	return err
}
