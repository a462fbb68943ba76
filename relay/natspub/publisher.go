package natspub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/routing"
)

// Defaults of Config.
const (
	// DefaultMaxInFlight is how many messages may await their
	// acknowledgement at once.
	DefaultMaxInFlight = 4096
	// DefaultAckTimeout bounds how long one Publish call waits for its
	// acknowledgements.
	DefaultAckTimeout = 30 * time.Second
)

// Config configures a Publisher.
type Config struct {
	// Source, when set, goes into every message's event_source header and
	// qualifies its Nats-Msg-Id ("<source>:<id>"). Keep it to
	// outbox.MaxSourceLen bytes: Emit sizes events for a source of at most
	// that. Defaults to "" (no header; Nats-Msg-Id is the id alone).
	Source string
	// MaxPayloadBytes, when positive, is the largest message (headers
	// included) every subject is taken to accept, instead of the smaller
	// of the server's max_payload (from the connection) and the capturing
	// stream's max_msg_size (from its info, cached for a minute). Set it
	// when the relayer may not read stream info. Defaults to 0 (ask the
	// server).
	MaxPayloadBytes int
	// MaxInFlight bounds the messages awaiting their acknowledgement at
	// once. Defaults to DefaultMaxInFlight (4096).
	MaxInFlight int
	// AckTimeout bounds how long one Publish call waits for the
	// acknowledgements of its messages (within its ctx): those still
	// unacknowledged then fail with an error a retry may fix, and are sent
	// again (the stream drops the copies it already holds). Defaults to
	// DefaultAckTimeout (30s).
	AckTimeout time.Duration
	// CloudEvents, when set, stamps every message with the CloudEvents
	// attributes of its event in the NATS binding's binary mode: ce-
	// headers (ce-specversion, ce-id, ce-source, ce-type, ce-subject,
	// ce-time, ce-datacontenttype, ce-dataschema), values percent-encoded
	// (package cloudevents). Producers' routing.NATS must then count them
	// (CloudEvents). Defaults to nil (no CloudEvents headers).
	CloudEvents *cloudevents.Config
	// Logger receives the publisher's warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Validate reports the first field of cfg that a Publisher cannot use as
// documented, saying what to set instead.
func (cfg Config) Validate() error {
	cfg = cfg.WithDefaults()
	if len(cfg.Source) > outbox.MaxSourceLen || pgtext.Invalid(cfg.Source) != "" {
		return fmt.Errorf("natspub: Source: use at most %d bytes of UTF-8 text without NUL (producers size events for that)", outbox.MaxSourceLen)
	}
	if cfg.CloudEvents != nil {
		if err := cfg.CloudEvents.Validate(); err != nil {
			return fmt.Errorf("natspub: CloudEvents: %w", err)
		}
	}
	if cfg.MaxPayloadBytes < 0 {
		return fmt.Errorf("natspub: MaxPayloadBytes is %d; use a positive size in bytes, or 0 to ask the server", cfg.MaxPayloadBytes)
	}
	if cfg.MaxInFlight < 1 {
		return fmt.Errorf("natspub: MaxInFlight is %d; use a positive number of messages, or 0 for the default (%d)", cfg.MaxInFlight, DefaultMaxInFlight)
	}
	if cfg.AckTimeout < 0 {
		return fmt.Errorf("natspub: AckTimeout is %s; use a positive duration, e.g. 30s, or 0 for the default", cfg.AckTimeout)
	}
	return nil
}

// Publisher is a relay.Sink that publishes to NATS JetStream with
// acknowledgements: an event goes to the subject its type routes to
// (routing.NATS), with Nats-Msg-Id set so the stream drops a copy sent
// again within its duplicate window, and counts as delivered once the
// stream that captures the subject acknowledged storing it.
//
// Messages of different aggregates go out together without waiting for
// each other's acknowledgements; an aggregate's next message goes only
// once its previous one is acknowledged. JetStream keeps no per-sender
// sequence that would refuse a message behind a lost one (as Kafka's
// idempotent producer does), so this is what keeps a failed message from
// being overtaken by a later one of its aggregate: after a failure, the
// aggregate's later messages of the call are not sent.
//
// A message is refused before it is sent when no stream captures its
// subject (relay.ReasonInvalidTopic), when it is larger than the server's
// max_payload or the stream's max_msg_size (relay.ReasonTooLarge), or
// when its own headers use aggregate_id (relay.ReasonReservedHeader).
type Publisher struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	cfg    Config
	limits *limits

	// health is the last publishes' outcome, for Ready.
	health relay.PublishHealth
}

var (
	_ relay.Sink    = (*Publisher)(nil)
	_ relay.Readier = (*Publisher)(nil)
)

// New returns a Publisher on nc, which stays the caller's to close (after
// the relayer stopped). It applies cfg's defaults and refuses a config
// Validate refuses.
func New(nc *nats.Conn, cfg Config) (*Publisher, error) {
	if nc == nil {
		return nil, errors.New("natspub: the connection is nil; pass one from nats.Connect")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxInFlight))
	if err != nil {
		return nil, fmt.Errorf("natspub: %w", err)
	}
	return &Publisher{nc: nc, js: js, cfg: cfg, limits: newLimits(nc, js, cfg.MaxPayloadBytes)}, nil
}

// MessagingSystem names NATS in the relayer's publish spans (see
// relay.MessagingSystem).
func (p *Publisher) MessagingSystem() string { return "nats" }

// Routing is NATS's routing for topicPrefix: routing.NATS, which
// producers set as outbox.Config.Routing so that a type Emit accepts is a
// subject the relayer can publish to. It refuses a prefix that cannot
// start a subject.
func (p *Publisher) Routing(topicPrefix string) (outbox.Routing, error) {
	r := routing.NATS{TopicPrefix: topicPrefix, CloudEvents: p.cfg.CloudEvents != nil}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("natspub: %w", err)
	}
	return r, nil
}

// errNotSent marks a message left unsent because an earlier message of its
// aggregate failed in the same call.
var errNotSent = errors.New("not sent: an earlier message of its aggregate failed")

// message builds the NATS message of m. The event's own headers go
// through routing.EscapeNATSHeader so that they arrive byte for byte;
// the CloudEvents headers, when stamped, replace any of the same name.
func (p *Publisher) message(m *relay.Message) *nats.Msg {
	id := strconv.FormatInt(m.ID, 10)
	h := make(nats.Header, 14+len(m.Headers))
	for k, v := range m.Headers {
		if outbox.IsReservedHeader(k) || k == outbox.HeaderAggregateID {
			continue
		}
		ek, ev := routing.EscapeNATSHeader(k, v)
		h[ek] = []string{ev}
	}
	for _, a := range p.ceHeaders(m) {
		h[a.Name] = []string{a.Value}
	}
	h[routing.HeaderNATSMsgID] = []string{routing.NATSMsgID(p.cfg.Source, m.ID)}
	h[outbox.HeaderEventID] = []string{id}
	h[outbox.HeaderEventType] = []string{m.Type}
	h[outbox.HeaderContentType] = []string{relay.ContentTypeOf(m)}
	h[outbox.HeaderAggregateID] = []string{m.AggregateID.String()}
	if p.cfg.Source != "" {
		h[outbox.HeaderEventSource] = []string{p.cfg.Source}
	}
	return &nats.Msg{Subject: m.Topic, Header: h, Data: m.Payload}
}

// Publish refuses the messages it can tell the server would refuse, sends
// the rest, each aggregate's one at a time, and waits for every
// acknowledgement (see Publisher), within ctx.
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	caller := ctx // cancelled on shutdown, which is no failure to report
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
	defer cancel()
	lims := p.limits.lookup(ctx, subjectsOf(msgs))
	queues := map[uuid.UUID][]int{}
	var order []uuid.UUID
	failed := map[uuid.UUID]bool{}
	sent := 0
	for i := range msgs {
		m := &msgs[i]
		if failed[m.AggregateID] {
			errs[i] = errNotSent
			continue
		}
		if err := p.refuse(m, lims[m.Topic]); err != nil {
			errs[i] = err
			failed[m.AggregateID] = true
			continue
		}
		if _, ok := queues[m.AggregateID]; !ok {
			order = append(order, m.AggregateID)
		}
		queues[m.AggregateID] = append(queues[m.AggregateID], i)
		sent++
	}
	p.chain(ctx, msgs, order, queues, errs)
	if sent > 0 {
		p.noteOutcome(caller, errs)
	}
	return errs
}

// refuse returns the permanent error of a message the server would refuse
// for good, checked before it is sent, or nil.
func (p *Publisher) refuse(m *relay.Message, lim subjectLimit) error {
	if _, ok := m.Headers[outbox.HeaderAggregateID]; ok {
		return relay.PermanentReason(relay.ReasonReservedHeader, fmt.Errorf(
			"the event's headers use %q, which the relayer sets to the event's aggregate on NATS; rename the header and retry the row ('outbox events retry'), or park it", outbox.HeaderAggregateID))
	}
	if lim.noStream {
		return relay.PermanentReason(relay.ReasonInvalidTopic, noStreamError(m.Topic))
	}
	hdrs := m.Headers
	if p.cfg.CloudEvents != nil {
		hdrs = cloudevents.NATS.With(p.cfg.CloudEvents.Attributes(m.CloudEvent()), m.Headers)
	}
	size := routing.NATS{}.MessageSize(m.ID, m.Type, len(m.Payload), hdrs, p.cfg.Source)
	if size > lim.bytes {
		return relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf(
			"the NATS message is %d bytes with its headers (payload %d); subject %q accepts at most %d (%s). Raise that limit and retry the row ('outbox events retry'), or park it",
			size, len(m.Payload), m.Topic, lim.bytes, lim.from))
	}
	return nil
}

// ceHeaders are the CloudEvents headers of m, or nil when the publisher
// stamps none.
func (p *Publisher) ceHeaders(m *relay.Message) []cloudevents.Attribute {
	if p.cfg.CloudEvents == nil {
		return nil
	}
	return cloudevents.NATS.Headers(p.cfg.CloudEvents.Attributes(m.CloudEvent()))
}

func noStreamError(subject string) error {
	return fmt.Errorf("%w: no JetStream stream captures subject %q; add the subject to a stream (e.g. nats stream add --subjects %q) and retry the row ('outbox events retry'), or park it",
		jetstream.ErrStreamNotFound, subject, subject)
}

// chain publishes the queued messages (queues: each aggregate's, in
// order; order: the aggregates as they first appear) and sets their
// results in errs. An aggregate's next message goes as soon as its
// previous one is acknowledged, while other aggregates' are in flight; at
// most MaxInFlight are unacknowledged at once, so that the client never
// stalls a publish (which it fails after a short wait). After a failure,
// the aggregate's later messages are not sent.
func (p *Publisher) chain(ctx context.Context, msgs []relay.Message, order []uuid.UUID, queues map[uuid.UUID][]int, errs []error) {
	results := make(chan ackResult, p.cfg.MaxInFlight)
	ready := slices.Clone(order)
	inflight := 0
	settle := func(i int, err error) {
		agg := msgs[i].AggregateID
		errs[i] = err
		rest := queues[agg][1:]
		switch {
		case err != nil:
			for _, j := range rest {
				errs[j] = errNotSent
			}
			delete(queues, agg)
		case len(rest) == 0:
			delete(queues, agg)
		default:
			queues[agg] = rest
			ready = append(ready, agg)
		}
	}
	for len(ready) > 0 || inflight > 0 {
		for len(ready) > 0 && inflight < p.cfg.MaxInFlight {
			agg := ready[0]
			ready = ready[1:]
			i := queues[agg][0]
			if err := p.publishOne(ctx, msgs, i, results); err != nil {
				settle(i, err)
				continue
			}
			inflight++
		}
		if inflight > 0 {
			r := <-results
			inflight--
			settle(r.i, r.err)
		}
	}
}

// ackResult is the outcome of the message at index i.
type ackResult struct {
	i   int
	err error
}

// publishOne sends the message at i and reports its acknowledgement (or
// why there is none) on results; it returns the error of a message it
// could not send.
func (p *Publisher) publishOne(ctx context.Context, msgs []relay.Message, i int, results chan<- ackResult) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m := &msgs[i]
	f, err := p.js.PublishMsgAsync(p.message(m))
	if err != nil {
		return p.classify(ctx, m, err)
	}
	go func() {
		select {
		case <-f.Ok():
			results <- ackResult{i, nil}
		case err := <-f.Err():
			results <- ackResult{i, p.classify(ctx, m, err)}
		case <-ctx.Done():
			results <- ackResult{i, fmt.Errorf("no acknowledgement from JetStream for subject %q: %w", m.Topic, ctx.Err())}
		}
	}()
	return nil
}

// classify wraps the errors that retrying cannot fix with
// relay.PermanentReason. No responders may mean that no stream captures
// the subject, or that JetStream is not up yet (a server restarting): the
// stream lookup tells them apart.
func (p *Publisher) classify(ctx context.Context, m *relay.Message, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum), errors.Is(err, nats.ErrMaxPayload):
		p.limits.forget(m.Topic)
		return relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf("subject %q: %w; raise the stream's max_msg_size (or the server's max_payload) and retry the row ('outbox events retry'), or park it", m.Topic, err))
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		p.limits.forget(m.Topic)
		if p.limits.streamMissing(ctx, m.Topic) {
			return relay.PermanentReason(relay.ReasonInvalidTopic, noStreamError(m.Topic))
		}
	}
	return fmt.Errorf("subject %q: %w", m.Topic, err)
}

// noteOutcome records whether the last publish went through, for Ready.
func (p *Publisher) noteOutcome(ctx context.Context, errs []error) {
	p.health.Note(ctx, errs, errNotSent)
}

// Ready returns nil when the publisher can publish: its last publish did
// not end in an error a retry may fix, the connection is up, and
// JetStream answers for the account.
func (p *Publisher) Ready(ctx context.Context) error {
	if err := p.health.Err(); err != nil {
		return err
	}
	if s := p.nc.Status(); s != nats.CONNECTED {
		return fmt.Errorf("NATS connection is %s", s)
	}
	if _, err := p.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("JetStream does not answer: %w", err)
	}
	return nil
}

func subjectsOf(msgs []relay.Message) []string {
	seen := map[string]bool{}
	var out []string
	for i := range msgs {
		if s := msgs[i].Topic; !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
