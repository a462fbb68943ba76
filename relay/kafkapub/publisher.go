package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/pgtext"
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
	// CloudEvents, when set, stamps every record with the CloudEvents
	// attributes of its event in Kafka's binary mode: ce_specversion,
	// ce_id, ce_source, ce_type, ce_subject, ce_time and ce_dataschema
	// headers, with content-type as datacontenttype (package cloudevents).
	// The routing producers size events with must then count them
	// (outbox.KafkaRouting.CloudEvents). Defaults to nil (no CloudEvents
	// headers).
	CloudEvents *cloudevents.Config
	// Logger receives a warning when a topic is found to have a new id at
	// the broker (see Publisher). Defaults to slog.Default().
	Logger *slog.Logger
}

// Publisher is a relay.Sink on a franz-go client. The client should
// be built with NewPublisherClient.
//
// A failure belongs to the record that caused it. A record larger than its
// topic accepts is refused before it is sent. When the broker refuses a
// whole produce request (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE,
// INVALID_RECORD apply to a partition's whole batch), its records are sent
// again in halves, down to single records, so that only the culprit fails
// and the records that shared its request go through; records after a
// failed one of their aggregate are not sent, so nothing overtakes it.
//
// A topic that was deleted and recreated, or a broker replaced by one that
// lost its state, has a new topic id; franz-go keeps the old one and fails
// every record of the topic with UNKNOWN_TOPIC_ID until the topic is purged
// from the client. The Publisher purges such a topic once every record of
// the call is settled (so nothing of it is in flight) and sends its records
// again, once, in the same call.
type Publisher struct {
	client *kgo.Client
	source string
	ce     *cloudevents.Config
	limits *topicLimits
	log    *slog.Logger

	// health is the last publishes' outcome, for Ready.
	health relay.PublishHealth
}

// NewPublisher wraps client. On a client from NewPublisherClient, produce
// batches are sized per topic by the limits the Publisher learns; on
// another, by that client's ProducerBatchMaxBytes, and requests the broker
// refuses as too large are split as described above. It applies cfg's
// defaults; it does not refuse a config (a negative MaxMessageBytes counts
// as 0): call cfg.Validate first to have a bad one named.
func NewPublisher(client *kgo.Client, cfg PublisherConfig) *Publisher {
	cfg = cfg.WithDefaults()
	lim, ok := limitsOf(client)
	if !ok {
		lim = newTopicLimits()
		lim.bind(client)
	}
	lim.mu.Lock()
	lim.override = max(cfg.MaxMessageBytes, 0)
	lim.mu.Unlock()
	return &Publisher{client: client, source: cfg.Source, ce: cfg.CloudEvents, limits: lim, log: cfg.Logger}
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg PublisherConfig) WithDefaults() PublisherConfig {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Validate reports the first field of cfg that a Publisher cannot use as
// documented, saying what to set instead.
func (cfg PublisherConfig) Validate() error {
	if len(cfg.Source) > outbox.MaxSourceLen || pgtext.Invalid(cfg.Source) != "" {
		return fmt.Errorf("kafkapub: Source: use at most %d bytes of UTF-8 text without NUL (producers size events for that)", outbox.MaxSourceLen)
	}
	if cfg.CloudEvents != nil {
		if err := cfg.CloudEvents.Validate(); err != nil {
			return fmt.Errorf("kafkapub: CloudEvents: %w", err)
		}
	}
	if cfg.MaxMessageBytes < 0 {
		return fmt.Errorf("kafkapub: MaxMessageBytes is %d; use a positive size in bytes, or 0 to ask the broker", cfg.MaxMessageBytes)
	}
	return nil
}

// NewPublisherClient builds a franz-go client for publishing from cfg:
// kafka.ProducerOptions, manual flushing, one produce request in flight
// per broker without idempotence (see newPublisherClient for why), and
// produce batches capped per topic at the limit a Publisher on it learns
// from the broker.
func NewPublisherClient(cfg kafka.ClientConfig) (*kgo.Client, error) {
	return newPublisherClient(cfg, false)
}

// NewSharedPublisherClient is NewPublisherClient for a client that
// several Publishers share, one per outbox, e.g. every outbox a process
// relays to one cluster: one set of broker connections for all. Its
// Publishers publish one at a time: a Flush sends every record the client
// holds, and records of two batches sent as they are produced could
// overtake a refused record of their aggregate. So one outbox's batch can
// wait for another's to be acknowledged: a round trip while the cluster is
// healthy, up to the client's RecordDeliveryTimeout while a partition of
// the other's topic has no leader.
// Its Publishers must share their MaxMessageBytes, which is the client's.
// A Publisher that purges a recreated topic makes the others' next
// records to it wait for the topic's metadata again.
func NewSharedPublisherClient(cfg kafka.ClientConfig) (*kgo.Client, error) {
	return newPublisherClient(cfg, true)
}

func newPublisherClient(cfg kafka.ClientConfig, shared bool) (*kgo.Client, error) {
	opts, err := cfg.Options()
	if err != nil {
		return nil, err
	}
	lim := newTopicLimits()
	lim.shared, lim.partitioned = shared, true
	// Records go out only at a Flush, one produce request in flight per
	// broker, without idempotence (which keeps up to five in flight). A
	// partition's records that fill more than one request then go one
	// request after the other, and when the broker refuses one for good
	// (INVALID_RECORD, a size it refuses as a whole) the client fails the
	// partition's remaining records with it: none of them can be
	// acknowledged ahead of the refused one, and overtake it. With
	// several requests in flight the broker refused one and accepted the
	// next (seen under load). That holds for the records in the
	// partition's buffer when the refusal comes back, so a Flush starts
	// only once all of a batch's records are there (partitionHook). A
	// retry after a lost response can then write a record twice, which
	// at-least-once allows; TxPublisher's lanes keep idempotence, which
	// transactions need, and abort whole on a failure.
	own := append(kafka.ProducerOptions(), kgo.ProducerBatchMaxBytesFn(lim.batchMaxBytes),
		kgo.ManualFlushing(), kgo.DisableIdempotentWrite(), kgo.MaxProduceRequestsInflightPerBroker(1),
		kgo.WithHooks(partitionHook{}))
	client, err := kgo.NewClient(append(own, opts...)...)
	if err != nil {
		return nil, err
	}
	lim.bind(client)
	registerLimits(client, lim)
	return client, nil
}

// record builds the Kafka record for one outbox message. The message's own
// headers, the trace context Emit wrote (traceparent, tracestate) among
// them, follow the relayer's, sorted by name. They never shadow the
// relayer's: the relayer refuses a row whose headers use a reserved name,
// and record drops such a header if one gets here anyway. With ce set,
// the CloudEvents headers follow the relayer's, and an event header of
// the same name as one of them is dropped too.
func record(m relay.Message, source string, ce []cloudevents.Attribute) *kgo.Record {
	hdrs := make([]kgo.RecordHeader, 0, 4+len(ce)+len(m.Headers))
	hdrs = append(hdrs,
		kgo.RecordHeader{Key: outbox.HeaderEventID, Value: strconv.AppendInt(nil, m.ID, 10)},
		kgo.RecordHeader{Key: outbox.HeaderEventType, Value: []byte(m.Type)},
		kgo.RecordHeader{Key: outbox.HeaderContentType, Value: []byte(relay.ContentTypeOf(&m))},
	)
	if source != "" {
		hdrs = append(hdrs, kgo.RecordHeader{Key: outbox.HeaderEventSource, Value: []byte(source)})
	}
	for _, h := range ce {
		hdrs = append(hdrs, kgo.RecordHeader{Key: h.Name, Value: []byte(h.Value)})
	}
	if len(m.Headers) > 0 {
		keys := make([]string, 0, len(m.Headers))
		for k := range m.Headers {
			if !outbox.IsReservedHeader(k) && !stamped(ce, k) {
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

// stamped reports whether hdrs holds a header named name.
func stamped(hdrs []cloudevents.Attribute, name string) bool {
	for _, h := range hdrs {
		if h.Name == name {
			return true
		}
	}
	return false
}

// ceHeaders are the CloudEvents headers of m, or nil when the publisher
// stamps none.
func (p *Publisher) ceHeaders(m *relay.Message) []cloudevents.Attribute {
	if p.ce == nil {
		return nil
	}
	return cloudevents.Kafka.Headers(p.ce.Attributes(m.CloudEvent()))
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
	if p.limits.shared {
		// One Publish at a time on a shared client: a Flush sends what
		// the client holds, so two at once would send each other's
		// records as they are produced, out of the order above.
		p.limits.publishMu.Lock()
		defer p.limits.publishMu.Unlock()
	}
	errs, send, topics := p.admit(ctx, msgs)
	var done []int
	for w, idx := range rounds(msgs, send, topics) {
		if w > 0 {
			idx = notBehindFailure(msgs, done, idx, errs)
		}
		p.send(ctx, msgs, idx, errs)
		if again := p.recreated(ctx, msgs, idx, errs); len(again) > 0 {
			p.send(ctx, msgs, again, errs)
		}
		done = append(done, idx...)
	}
	p.noteOutcome(ctx, send, errs)
	return errs
}

// admit refuses the records of msgs larger than their topic accepts (and
// leaves the later records of their aggregates unsent), and returns the
// errors so far, the indexes of the records to send and how many topics
// msgs go to.
func (p *Publisher) admit(ctx context.Context, msgs []relay.Message) (errs []error, send []int, topics int) {
	errs = make([]error, len(msgs))
	limits := p.limits.lookup(ctx, topicsOf(msgs))
	var failed map[uuid.UUID]bool
	send = make([]int, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if failed[m.AggregateID] {
			errs[i] = errNotSent
			continue
		}
		lim := limits[m.Topic]
		hdrs := m.Headers
		if p.ce != nil {
			hdrs = cloudevents.Kafka.With(p.ce.Attributes(m.CloudEvent()), m.Headers)
		}
		if size := (outbox.KafkaRouting{}).RecordSize(m.ID, m.Type, relay.SizedPayloadLen(m), hdrs, p.source); size > lim.bytes {
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
	return errs, send, len(limits)
}

// rounds splits idx (ascending) into the rounds Publish sends one after the
// other. Kafka keeps order within a partition only, and an aggregate's
// records to one topic share a partition (the key picks it); its records
// to two topics do not, so one sent beside an earlier record of its
// aggregate on another topic could be acknowledged while that one failed.
// An aggregate's records therefore stay in one round while they go to one
// topic, and a record to another topic than its aggregate's previous one
// goes a round later, once the earlier ones are settled. With one topic
// (topics), there is one round.
func rounds(msgs []relay.Message, idx []int, topics int) [][]int {
	if topics <= 1 || len(idx) <= 1 {
		return [][]int{idx}
	}
	type last struct {
		topic string
		round int
	}
	seen := make(map[uuid.UUID]last, len(idx))
	var out [][]int
	for _, i := range idx {
		m := &msgs[i]
		r := 0
		if l, ok := seen[m.AggregateID]; ok {
			r = l.round
			if l.topic != m.Topic {
				r++
			}
		}
		seen[m.AggregateID] = last{m.Topic, r}
		if r == len(out) {
			out = append(out, nil)
		}
		out[r] = append(out[r], i)
	}
	return out
}

// recreated purges the topics whose records of idx failed with
// UNKNOWN_TOPIC_ID from the client and returns those records, to be sent
// again (less those behind another failure of their aggregate).
func (p *Publisher) recreated(ctx context.Context, msgs []relay.Message, idx []int, errs []error) []int {
	if ctx.Err() != nil {
		return nil
	}
	var again []int
	var topics []string
	for _, i := range idx {
		if errors.Is(errs[i], kerr.UnknownTopicID) {
			errs[i] = nil
			again = append(again, i)
			if !slices.Contains(topics, msgs[i].Topic) {
				topics = append(topics, msgs[i].Topic)
			}
		}
	}
	if len(again) == 0 {
		return nil
	}
	p.log.Warn("Kafka topic has a new id at the broker (deleted and recreated, or the broker was replaced and lost its state); forgetting the old id and sending its records again",
		"topics", topics, "records", len(again))
	p.client.PurgeTopicsFromClient(topics...)
	p.limits.forget(topics)
	return notBehindFailure(msgs, idx, again, errs)
}

// noteOutcome records whether the records of idx went through, for Ready:
// any error a retry may fix marks the publisher failing; a publish with
// every record acknowledged clears it.
func (p *Publisher) noteOutcome(ctx context.Context, idx []int, errs []error) {
	sub := make([]error, len(idx))
	for k, i := range idx {
		sub[k] = errs[i]
	}
	p.health.Note(ctx, sub, errNotSent)
}

// Ready returns nil when the publisher can produce: its last publish did
// not end in an error a retry may fix (the broker unreachable, a request
// timed out, a topic the client cannot produce to), and the broker answers
// a ping. It is what the relay's /readyz asks the broker, so that a broker
// that answers metadata requests but takes no records does not pass.
func (p *Publisher) Ready(ctx context.Context) error {
	if err := p.health.Err(); err != nil {
		return err
	}
	return p.client.Ping(ctx)
}

// send produces the records of msgs at idx (ascending), waits for them and
// sets their results in errs. Records of a request the broker refused as a
// whole are sent again in two halves, one after the other, until a single
// record is left to take the error: the culprit.
func (p *Publisher) send(ctx context.Context, msgs []relay.Message, idx []int, errs []error) {
	if len(idx) == 0 {
		return
	}
	p.produce(ctx, msgs, idx, errs)
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

// produce produces the records of msgs at idx on the publisher's own
// client, flushes it once every record is in its partition's buffer
// (on a client of newPublisherClient) and waits for every result.
func (p *Publisher) produce(ctx context.Context, msgs []relay.Message, idx []int, errs []error) {
	var wg, parted sync.WaitGroup
	wg.Add(len(idx))
	var out atomic.Int64 // records of the batch without their result yet
	out.Store(int64(len(idx)))
	var rctx []recordContext // one allocation for the batch, not one per record
	if p.limits.partitioned {
		parted.Add(len(idx))
		rctx = make([]recordContext, len(idx))
	}
	for j, i := range idx {
		rec := record(msgs[i], p.source, p.ceHeaders(&msgs[i]))
		var part *partitionedRecord
		if rctx != nil {
			rctx[j] = recordContext{Context: ctx, part: partitionedRecord{wg: &parted}}
			part, rec.Context = &rctx[j].part, &rctx[j]
		}
		p.client.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				errs[i] = classify(err)
			}
			if part != nil {
				part.done() // failed before it was partitioned, or after
			}
			out.Add(-1)
			wg.Done()
		})
	}
	if rctx != nil {
		waitFor(ctx, &parted)
	}
	if err := p.flush(ctx, &out); err != nil {
		// Not sent yet: fail them now, or the next Flush would send them
		// behind the relayer's back.
		p.client.AbortBufferedRecords(context.WithoutCancel(ctx)) //nolint:errcheck // waits for in-flight requests
	}
	wg.Wait()
}

// flushRetry bounds each Flush of flush.
const flushRetry = 250 * time.Millisecond

// flush flushes the client until every record of the batch has its result
// (out is 0) or ctx ends. A Flush drains the partitions it finds
// loaded when it starts, and the records of a topic the client has just
// learned are partitioned a moment before its partitions are stored: a
// Flush started in that moment misses them and would wait for them in
// vain. So each Flush is bounded by flushRetry, and one that ends with
// records of the batch still out starts again.
func (p *Publisher) flush(ctx context.Context, out *atomic.Int64) error {
	for {
		fctx, cancel := context.WithTimeout(ctx, flushRetry)
		err := p.client.Flush(fctx)
		cancel()
		switch {
		case err == nil, out.Load() == 0:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		}
	}
}

// partitionHook tells a record's partitionedRecord (its Context) that
// the client put it in its partition's buffer. Records of a topic the
// client does not know yet wait for its metadata, then are partitioned
// one by one: a Flush already running sends the first of them while the
// rest are not there yet, and when the broker refuses that request the
// client fails only what its buffer held; the rest go in a later request
// and can be acknowledged, overtaking the refused records of their
// aggregates (seen on a topic's first batch). So produce flushes only once
// every record of the batch is partitioned (or failed).
type partitionHook struct{}

var _ kgo.HookProduceRecordPartitioned = partitionHook{}

func (partitionHook) OnProduceRecordPartitioned(r *kgo.Record, _ int32) {
	if part, ok := r.Context.Value(partitionedKey{}).(*partitionedRecord); ok {
		part.done()
	}
}

type partitionedKey struct{}

// recordContext is a record's Context while produce waits for it to be
// partitioned: its parent's, with the record's partitionedRecord under
// partitionedKey (found through any context another hook wraps it in).
type recordContext struct {
	context.Context
	part partitionedRecord
}

func (c *recordContext) Value(key any) any {
	if key == (partitionedKey{}) {
		return &c.part
	}
	return c.Context.Value(key)
}

// partitionedRecord counts one record down in a batch's WaitGroup, once:
// when it is partitioned, or when it fails first.
type partitionedRecord struct {
	once sync.Once
	wg   *sync.WaitGroup
}

func (p *partitionedRecord) done() { p.once.Do(p.wg.Done) }

// waitFor waits for wg, or for ctx to end.
func waitFor(ctx context.Context, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
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

// classify wraps errors that retrying cannot fix with relay.PermanentReason.
func classify(err error) error {
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
