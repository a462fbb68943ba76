package amqppub

import (
	"context"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/relay"
)

// flight is one Publish call on one channel: every aggregate has at most
// one message in flight, and its next is sent when that one is confirmed.
type flight struct {
	p    *Publisher
	oc   *openChannel
	msgs []relay.Message
	errs []error
	// next holds, per aggregate, the indexes of its messages not yet
	// sent, in order.
	next map[uuid.UUID][]int
	// inflight maps a delivery tag to the index of its message.
	inflight map[uint64]int
	// returned holds the messages the server sent back (basic.return),
	// by message id, until their confirm comes.
	returned map[string]amqp.Return
}

// Publish sends msgs to the exchange, each with the routing key of its
// Topic, and waits for every confirm, within ctx and ConfirmTimeout. See
// Publisher for the order it sends them in.
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	oc, err := p.channel(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	// Past ctx, the connection is given up: a write may be stuck on a
	// server that stopped reading, and amqp091 would wait for ever.
	raw := p.raw
	defer context.AfterFunc(ctx, func() { _ = raw.Close() })()
	f := &flight{p: p, oc: oc, msgs: msgs, errs: errs, next: map[uuid.UUID][]int{},
		inflight: map[uint64]int{}, returned: map[string]amqp.Return{}}
	var order []uuid.UUID
	for i := range msgs {
		a := msgs[i].AggregateID
		if _, ok := f.next[a]; !ok {
			order = append(order, a)
		}
		f.next[a] = append(f.next[a], i)
	}
	for _, a := range order {
		f.send(ctx, a)
	}
	f.wait(ctx)
	return errs
}

// send publishes the next message of aggregate a, unless a check refuses
// it first.
func (f *flight) send(ctx context.Context, a uuid.UUID) {
	q := f.next[a]
	if len(q) == 0 {
		return
	}
	i := q[0]
	f.next[a] = q[1:]
	m := &f.msgs[i]
	if err := f.p.check(m, f.oc.frameMax); err != nil {
		f.fail(i, err)
		return
	}
	tag := f.oc.ch.GetNextPublishSeqNo()
	if err := f.oc.ch.PublishWithContext(ctx, f.p.cfg.Exchange, m.Topic, true, false, publishing(m, f.p.cfg.Source, f.p.ceHeaders(m))); err != nil {
		f.fail(i, fmt.Errorf("amqppub: cannot send message %d: %w", m.ID, err))
		return
	}
	f.inflight[tag] = i
}

// fail sets message i's error, and every later message of its aggregate
// is left unsent.
func (f *flight) fail(i int, err error) {
	f.errs[i] = err
	a := f.msgs[i].AggregateID
	for _, j := range f.next[a] {
		f.errs[j] = errNotSent
	}
	f.next[a] = nil
}

// wait takes confirms and returns until nothing is in flight, the
// channel closes or ctx ends.
func (f *flight) wait(ctx context.Context) {
	for len(f.inflight) > 0 {
		select {
		case c, ok := <-f.oc.confirms:
			if !ok {
				f.closed(<-f.oc.closed)
				return
			}
			f.confirmed(ctx, c)
		case r, ok := <-f.oc.returns:
			if !ok {
				// Closed with the channel: the confirms say the rest.
				f.oc.returns = nil
				continue
			}
			f.returned[r.MessageId] = r
		case e := <-f.oc.closed:
			f.closed(e)
			return
		case <-ctx.Done():
			f.abandon(fmt.Errorf("amqppub: no confirm from the server in time: %w", ctx.Err()))
			return
		}
	}
}

// confirmed settles the message of c. The server sends a return before
// the confirm of the same message, and amqp091 hands both over from one
// goroutine, in that order: a return is in f.oc.returns by now.
func (f *flight) confirmed(ctx context.Context, c amqp.Confirmation) {
	i, ok := f.inflight[c.DeliveryTag]
	if !ok {
		return
	}
	delete(f.inflight, c.DeliveryTag)
	f.drainReturns()
	m := &f.msgs[i]
	id := strconv.FormatInt(m.ID, 10)
	if r, ok := f.returned[id]; ok {
		delete(f.returned, id)
		f.fail(i, noRoute(m, f.p.cfg.Exchange, r))
		return
	}
	if !c.Ack {
		f.fail(i, fmt.Errorf("%w: message %d to routing key %q (a queue refused it: full, with overflow reject-publish, or unavailable)", errNacked, m.ID, m.Topic))
		return
	}
	f.send(ctx, m.AggregateID)
}

func (f *flight) drainReturns() {
	for {
		select {
		case r, ok := <-f.oc.returns:
			if !ok {
				f.oc.returns = nil
				return
			}
			f.returned[r.MessageId] = r
		default:
			return
		}
	}
}

// closed settles what was in flight when the channel closed: the message
// the server closed it for (when it says: too large, or a routing key the
// user may not write), permanently; the others may
// have arrived or not, so they fail for a retry.
func (f *flight) closed(e *amqp.Error) {
	f.p.ch = nil
	culprit, limit := oversized(e)
	refusedKey := refusedTopic(e)
	if limit > 0 {
		f.p.maxBytes = limit
	}
	for tag, i := range f.inflight {
		delete(f.inflight, tag)
		m := &f.msgs[i]
		if refusedKey != "" && m.Topic == refusedKey {
			f.fail(i, relay.PermanentReason(relay.ReasonNotAuthorized, fmt.Errorf(
				"amqppub: the server refused message %d: the user may not publish with routing key %q to exchange %q (%v); grant it topic write permission, then retry the row ('outbox events retry'), or park it",
				m.ID, m.Topic, f.p.cfg.Exchange, e)))
			continue
		}
		if culprit > 0 && len(m.Payload) == culprit {
			f.fail(i, relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf(
				"amqppub: the server refused message %d: its body is %d bytes, over the server's max_message_size of %d (%v); raise max_message_size and retry the row ('outbox events retry'), or park it",
				m.ID, culprit, limit, e)))
			continue
		}
		f.fail(i, &closedError{id: m.ID, err: e})
	}
	f.unsentAll(errNotSent)
}

// abandon gives up on what is in flight: its confirms, if they come,
// would land in a later call, so the channel is closed.
func (f *flight) abandon(err error) {
	for tag, i := range f.inflight {
		delete(f.inflight, tag)
		f.fail(i, err)
	}
	f.unsentAll(errNotSent)
	_ = f.oc.ch.Close()
	f.p.ch = nil
}

func (f *flight) unsentAll(err error) {
	for a, q := range f.next {
		for _, j := range q {
			f.errs[j] = err
		}
		f.next[a] = nil
	}
}

// publishing is the AMQP message of m: persistent, with the event id as
// message_id, the type as type, and the relayer's headers and the row's
// own in the headers table, with the CloudEvents headers ce (which
// replace any of the row's of the same name).
func publishing(m *relay.Message, source string, ce []cloudevents.Attribute) amqp.Publishing {
	h := make(amqp.Table, 4+len(ce)+len(m.Headers))
	for k, v := range m.Headers {
		h[k] = v
	}
	for _, a := range ce {
		h[a.Name] = a.Value
	}
	id := strconv.FormatInt(m.ID, 10)
	h[outbox.HeaderEventID] = id
	h[outbox.HeaderEventType] = m.Type
	h[outbox.HeaderAggregateID] = m.AggregateID.String()
	if source != "" {
		h[outbox.HeaderEventSource] = source
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  relay.ContentTypeOf(m),
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Type:         m.Type,
		Body:         m.Payload,
	}
}

// check refuses, before sending, a message the server would refuse or
// mangle.
func (p *Publisher) check(m *relay.Message, frameMax int) error {
	if n := len(m.Payload); n > p.maxBytes {
		return relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf(
			"%w: message %d's body is %d bytes; the server accepts at most %d (max_message_size, as MaxBytes says). Raise the server's max_message_size and MaxBytes (?max_bytes= on --sink), then retry the row ('outbox events retry'), or park it",
			errTooLarge, m.ID, n, p.maxBytes))
	}
	if len(m.Topic) > 255 {
		return relay.PermanentReason(relay.ReasonInvalidTopic, fmt.Errorf(
			"%w: message %d's routing key is %d bytes; AMQP carries at most 255", errBadKey, m.ID, len(m.Topic)))
	}
	for k := range m.Headers {
		switch {
		case k == outbox.HeaderAggregateID || outbox.IsReservedHeader(k):
			return relay.PermanentReason(relay.ReasonReservedHeader, fmt.Errorf(
				"%w: message %d's own headers set %q, which the relayer sets on RabbitMQ; rename the header", errReserved, m.ID, k))
		case len(k) > 255:
			return relay.PermanentReason(relay.ReasonBrokerRefused, fmt.Errorf(
				"%w: message %d has a header name of %d bytes; AMQP field names hold at most 255", errBadHeader, m.ID, len(k)))
		}
	}
	hdrs := m
	if p.cfg.CloudEvents != nil {
		with := *m
		with.Headers = cloudevents.AMQP.With(p.cfg.CloudEvents.Attributes(m.CloudEvent()), m.Headers)
		hdrs = &with
	}
	if size := propertiesSize(hdrs, p.cfg.Source); frameMax > 0 && size > frameMax {
		return relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf(
			"%w: message %d's headers make %d bytes of properties; they travel in one frame, and the connection's frame_max is %d: shrink the headers or raise the server's frame_max",
			errTooLarge, m.ID, size, frameMax))
	}
	return nil
}

// ceHeaders are the CloudEvents headers of m, or nil when the publisher
// stamps none.
func (p *Publisher) ceHeaders(m *relay.Message) []cloudevents.Attribute {
	if p.cfg.CloudEvents == nil {
		return nil
	}
	return cloudevents.AMQP.Headers(p.cfg.CloudEvents.Attributes(m.CloudEvent()))
}

// propertiesSize is the length of the content header frame of m, an
// upper bound: frame header and end (8), class, weight, body size and
// flags (14), the short strings and the headers table.
func propertiesSize(m *relay.Message, source string) int {
	n := 8 + 14 + 1 + len(relay.ContentTypeOf(m)) + 1 + 1 + 20 + 1 + len(m.Type) + 4
	field := func(k string, v int) int { return 1 + len(k) + 1 + 4 + v }
	n += field(outbox.HeaderEventID, 20) + field(outbox.HeaderEventType, len(m.Type)) + field(outbox.HeaderAggregateID, 36)
	if source != "" {
		n += field(outbox.HeaderEventSource, len(source))
	}
	for k, v := range m.Headers {
		n += field(k, len(v))
	}
	return n
}
