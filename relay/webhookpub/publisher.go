package webhookpub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/webhookwire"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/routing"
)

// A Publisher is a relay.Sink.
var (
	_ relay.Sink    = (*Publisher)(nil)
	_ relay.Readier = (*Publisher)(nil)
)

// Publisher delivers events as Standard Webhooks requests: one POST per
// event, its payload as the body, signed with every secret; see the
// package doc.
type Publisher struct {
	cfg    Config
	client *http.Client
	// slots bounds the requests in flight per endpoint URL.
	mu    sync.Mutex
	slots map[string]chan struct{}
	// health is the last publishes' outcome, for Ready.
	health relay.PublishHealth
}

// New checks cfg (Validate, after WithDefaults) and builds a Publisher.
func New(cfg Config) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client := cfg.Client
	if client == nil {
		var err error
		if client, err = newClient(cfg); err != nil {
			return nil, err
		}
	}
	// Never follow a redirect: a 301 or 302 turns a POST into a GET.
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Publisher{cfg: cfg, client: &c, slots: map[string]chan struct{}{}}, nil
}

// Routing is routing.Webhook for topicPrefix, with the Publisher's
// MaxBytes and number of secrets.
func (p *Publisher) Routing(topicPrefix string) (outbox.Routing, error) {
	r := routing.Webhook{TopicPrefix: topicPrefix, MaxBytes: p.cfg.MaxBytes, Signatures: len(p.cfg.Secrets), CloudEvents: p.cfg.CloudEvents != nil}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// MessagingSystem names webhooks in the relayer's publish spans.
func (p *Publisher) MessagingSystem() string { return "webhook" }

// endpoint is the URL m goes to, or "" when none is configured.
func (p *Publisher) endpoint(m *relay.Message) string {
	if u, ok := p.cfg.Routes[m.Type]; ok {
		return u
	}
	if u, ok := p.cfg.Routes[m.Topic]; ok {
		return u
	}
	return p.cfg.Endpoint
}

func (p *Publisher) slot(endpoint string) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.slots[endpoint]
	if !ok {
		s = make(chan struct{}, p.cfg.Concurrency)
		p.slots[endpoint] = s
	}
	return s
}

// errNotSent marks an event left unsent because an earlier event of its
// aggregate failed in the same call.
var errNotSent = errors.New("webhook: not sent: an earlier event of its aggregate failed")

// check returns why m can never be sent as it is, or nil.
func (p *Publisher) check(m *relay.Message, endpoint string) error {
	if endpoint == "" {
		return relay.PermanentReason(relay.ReasonInvalidTopic, fmt.Errorf(
			"webhook: no route for type %q or topic %q, and no default endpoint; add a route for it to the routes file and retry the row ('outbox events retry')", m.Type, m.Topic))
	}
	for k := range m.Headers {
		why, bad := webhookwire.Reserved(k)
		if k == outbox.HeaderAggregateID {
			why, bad = "the sink sets the aggregate id itself", true
		}
		if bad {
			return relay.PermanentReason(relay.ReasonReservedHeader, fmt.Errorf("webhook: the event's header %q cannot travel as an HTTP header: %s; rename it in the producer", k, why))
		}
	}
	size := webhookwire.Size(m.Type, m.Topic, p.cfg.Source, len(strconv.FormatInt(m.ID, 10)), relay.SizedPayloadLen(m), m.Headers, len(p.cfg.Secrets))
	if p.cfg.CloudEvents != nil {
		size += routing.CloudEventsHTTPSize(p.cfg.CloudEvents.Attributes(m.CloudEvent()))
	}
	if size > p.cfg.MaxBytes {
		return relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf(
			"webhook: the request is %d bytes (payload %d); the limit is %d: raise max_bytes (and the endpoint's limits) and retry the row ('outbox events retry'), or park it", size, len(m.Payload), p.cfg.MaxBytes))
	}
	return nil
}

// Publish sends msgs: the events of one aggregate one at a time, in
// order, each retried (see Config.DeliveryTimeout) before the next is
// sent; different aggregates at once, up to Concurrency per endpoint. An
// event after a failed one of its aggregate is not sent.
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := make([]error, len(msgs))
	deadline := time.Now().Add(p.cfg.DeliveryTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	chains := map[uuid.UUID][]int{}
	var order []uuid.UUID
	for i := range msgs {
		a := msgs[i].AggregateID
		if _, ok := chains[a]; !ok {
			order = append(order, a)
		}
		chains[a] = append(chains[a], i)
	}
	var wg sync.WaitGroup
	for _, a := range order {
		wg.Go(func() {
			failed := false
			for _, i := range chains[a] {
				if failed {
					errs[i] = errNotSent
					continue
				}
				errs[i] = p.publishOne(ctx, &msgs[i], deadline)
				failed = errs[i] != nil
			}
		})
	}
	wg.Wait()
	p.noteOutcome(ctx, errs)
	return errs
}

// noteOutcome records, for Ready, whether a publish ended with an event
// an endpoint did not take although it may (it failed for the whole
// delivery timeout).
func (p *Publisher) noteOutcome(ctx context.Context, errs []error) {
	p.health.Note(ctx, errs, errNotSent)
}

// Ready returns nil when the last publish did not end in an error a retry
// may fix (an endpoint down, failing or throttling for the whole delivery
// timeout) and every endpoint can be connected to (Ping): what the relay's
// /readyz asks.
func (p *Publisher) Ready(ctx context.Context) error {
	if err := p.health.Err(); err != nil {
		return err
	}
	return p.Ping(ctx)
}

// publishOne checks m, then sends it until the endpoint takes it, refuses
// it for good, or the deadline comes.
func (p *Publisher) publishOne(ctx context.Context, m *relay.Message, deadline time.Time) error {
	endpoint := p.endpoint(m)
	if err := p.check(m, endpoint); err != nil {
		return err
	}
	slot := p.slot(endpoint)
	var last error
	for attempt := 0; ; attempt++ {
		select {
		case slot <- struct{}{}:
		case <-ctx.Done():
			return notDelivered(last, ctx.Err())
		}
		wait, err := p.attempt(ctx, m, endpoint, deadline)
		<-slot
		if err == nil || relay.IsPermanent(err) {
			return err
		}
		if last != nil && errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(deadline) {
			// Cut short by the call's deadline: the previous attempt's
			// error says more about the endpoint.
			return last
		}
		last = err
		if wait < 0 {
			wait = backoff(attempt, p.cfg.MinBackoff, p.cfg.MaxBackoff)
		}
		if time.Now().Add(wait).After(deadline) {
			return last
		}
		p.cfg.Logger.Debug("webhook retry", "endpoint", redact(endpoint), "event_id", m.ID, "attempt", attempt+1, "wait", wait, "error", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return notDelivered(last, ctx.Err())
		}
	}
}

// notDelivered is the error of an event whose retries ctx ended: the
// last attempt's error, which says more than ctx's.
func notDelivered(last, ctxErr error) error {
	if last != nil {
		return last
	}
	return fmt.Errorf("webhook: not sent: %w", ctxErr)
}

// attempt sends m once. On a retriable failure it returns how long the
// endpoint asked to wait (Retry-After), or -1 for the Publisher's backoff.
func (p *Publisher) attempt(ctx context.Context, m *relay.Message, endpoint string, deadline time.Time) (time.Duration, error) {
	timeout := min(p.cfg.RequestTimeout, time.Until(deadline))
	if timeout <= 0 {
		return -1, &RequestError{Endpoint: redact(endpoint), Err: context.DeadlineExceeded}
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := p.request(actx, m, endpoint)
	if err != nil {
		return -1, relay.Permanent(err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return -1, &RequestError{Endpoint: redact(endpoint), Err: err}
	}
	defer resp.Body.Close()
	return classify(resp, redact(endpoint), time.Now())
}

// request builds m's signed request.
func (p *Publisher) request(ctx context.Context, m *relay.Message, endpoint string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(m.Payload))
	if err != nil {
		return nil, fmt.Errorf("webhook: endpoint %s: %w", redact(endpoint), err)
	}
	id := webhookwire.MessageID(p.cfg.Source, m.ID)
	ts := time.Now().Unix()
	h := req.Header
	for k, v := range m.Headers {
		h[webhookwire.EncodeName(k)] = []string{webhookwire.EncodeValue(v)}
	}
	// Set lowercase, as Standard Webhooks writes them (http.Header.Set
	// would canonicalise them; HTTP does not care, some readers do).
	h[webhookwire.HeaderID] = []string{id}
	h[webhookwire.HeaderTimestamp] = []string{strconv.FormatInt(ts, 10)}
	h[webhookwire.HeaderSignature] = []string{webhookwire.Sign(p.cfg.Secrets, id, ts, m.Payload)}
	h[webhookwire.HeaderEventID] = []string{strconv.FormatInt(m.ID, 10)}
	h[webhookwire.HeaderEventType] = []string{webhookwire.EncodeValue(m.Type)}
	h[webhookwire.HeaderAggregateID] = []string{m.AggregateID.String()}
	h[webhookwire.HeaderTopic] = []string{webhookwire.EncodeValue(m.Topic)}
	if p.cfg.Source != "" {
		h[webhookwire.HeaderEventSource] = []string{webhookwire.EncodeValue(p.cfg.Source)}
	}
	h["content-type"] = []string{relay.ContentTypeOf(m)}
	if p.cfg.CloudEvents != nil {
		for _, a := range cloudevents.HTTP.Headers(p.cfg.CloudEvents.Attributes(m.CloudEvent())) {
			h[a.Name] = []string{a.Value}
		}
	}
	return req, nil
}
