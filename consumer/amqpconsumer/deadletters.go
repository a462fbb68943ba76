package amqpconsumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/dlq"
)

// dlqHeaderPrefix starts every header a dead letter adds to the original's.
const dlqHeaderPrefix = "dlq_"

// DeadLetters is the dlq.Store of the RabbitMQ consumer's dead-letter
// queues (<queue>.dlq by default).
//
// List reads a dead-letter queue without consuming it: it fetches every
// message with basic.get and manual acknowledgement, and at the end
// requeues them all (basic.nack, requeue), so they stay where they were,
// in queue order. While it runs it briefly holds the queue's messages
// unacknowledged: a consumer of the dead-letter queue would compete with
// it (and take what List then misses); leave the dead-letter queue
// without consumers.
//
// Replay publishes each letter back to the exchange it was first published
// to, with its original routing key, body, properties and headers (the
// dlq_* ones removed), persistent and mandatory, and waits for the
// server's publisher confirm. Only after that confirm does it remove the
// dead letter from the dead-letter queue (basic.ack), so replay removes
// what it sent back, and a letter it could not send stays. A message no
// queue is bound for is returned by the server: Replay stops there, and
// that dead letter stays.
type DeadLetters struct {
	url  string
	conn *amqp.Connection
}

var _ dlq.Store = (*DeadLetters)(nil)

// NewDeadLetters connects to the server at url
// (amqp[s]://user:pass@host:5672/vhost).
func NewDeadLetters(url string) (*DeadLetters, error) {
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, fmt.Errorf("amqpconsumer: URL %q: %v", redact(url), err)
	}
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("amqpconsumer: cannot connect to %s: %w; check the URL and that the server runs", redact(url), err)
	}
	return &DeadLetters{url: url, conn: conn}, nil
}

// Close closes the connection; what a List or Replay still held goes back
// to its queue.
func (s *DeadLetters) Close() { _ = s.conn.Close() }

// held is a dead-letter queue's messages, fetched and not yet settled.
type held struct {
	ch         *amqp.Channel
	deliveries []amqp.Delivery
	acked      map[uint64]bool
}

// hold fetches every message of queue, unacknowledged.
func (s *DeadLetters) hold(ctx context.Context, queue string) (*held, error) {
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqpconsumer: %w", err)
	}
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("amqpconsumer: cannot read dead-letter queue %q: %w (is it the dead-letter queue's name, <queue>.dlq by default?)", queue, err)
	}
	h := &held{ch: ch, acked: map[uint64]bool{}}
	for {
		if err := ctx.Err(); err != nil {
			h.release()
			return nil, fmt.Errorf("amqpconsumer: reading %s: %w", queue, err)
		}
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			h.release()
			return nil, fmt.Errorf("amqpconsumer: reading %s: %w", queue, err)
		}
		if !ok {
			return h, nil
		}
		h.deliveries = append(h.deliveries, d)
	}
}

// release requeues what h still holds (the server puts each back in its
// place) and closes its channel (which would requeue it too).
func (h *held) release() {
	// A nack of an acknowledged tag is a channel error: nack up to the
	// last one still held.
	for i := len(h.deliveries) - 1; i >= 0; i-- {
		if tag := h.deliveries[i].DeliveryTag; !h.acked[tag] {
			_ = h.ch.Nack(tag, true, true)
			break
		}
	}
	_ = h.ch.Close()
}

// ack removes d from its queue.
func (h *held) ack(d amqp.Delivery) error {
	if err := h.ch.Ack(d.DeliveryTag, false); err != nil {
		return err
	}
	h.acked[d.DeliveryTag] = true
	return nil
}

// List returns every message of the dead-letter queue dest, in queue
// order, and leaves them there; Position is each one's place in the queue
// (1 is the head) as List saw it.
func (s *DeadLetters) List(ctx context.Context, dest string) ([]dlq.Letter, error) {
	h, err := s.hold(ctx, dest)
	if err != nil {
		return nil, err
	}
	defer h.release()
	letters := make([]dlq.Letter, 0, len(h.deliveries))
	for i, d := range h.deliveries {
		letters = append(letters, fromDelivery(dest, i, d))
	}
	return letters, nil
}

// fromDelivery reads the dead letter d, the i-th of queue.
func fromDelivery(queue string, i int, d amqp.Delivery) dlq.Letter {
	l := dlq.Letter{Destination: queue, Position: strconv.Itoa(i + 1), Payload: d.Body}
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := headerText(d.Headers[k])
		switch {
		case k == consumer.HeaderDLQError:
			l.Error = v
		case k == consumer.HeaderDLQConsumer:
			l.Consumer = v
		case k == consumer.HeaderDLQAttempts:
			l.Attempts, _ = strconv.Atoi(v)
		case k == consumer.HeaderDLQOriginalTopic:
			l.OriginalTopic = v
		case strings.HasPrefix(k, dlqHeaderPrefix):
		default:
			l.Headers = append(l.Headers, dlq.Header{Key: k, Value: v})
			switch k {
			case outbox.HeaderEventID:
				l.EventID, _ = strconv.ParseInt(v, 10, 64)
			case outbox.HeaderEventType:
				l.Type = v
			case outbox.HeaderEventSource:
				l.Source = v
			case outbox.HeaderAggregateID:
				l.Key = []byte(v)
			}
		}
	}
	return l
}

// headerText is an AMQP header value as the consumer reads it.
func headerText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	default:
		return fmt.Sprint(v)
	}
}

// sameLetter says whether a and b are the same dead letter, wherever in
// the queue each was.
func sameLetter(a, b dlq.Letter) bool {
	return a.Destination == b.Destination && a.OriginalTopic == b.OriginalTopic && a.EventID == b.EventID &&
		a.Type == b.Type && a.Source == b.Source && a.Consumer == b.Consumer && a.Attempts == b.Attempts &&
		a.Error == b.Error && bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Payload, b.Payload) && slices.Equal(a.Headers, b.Headers)
}

// Replay sends each letter back to the exchange and routing key it was
// first published with, in order, and removes each from its dead-letter
// queue once the server confirmed it. It refuses, before sending
// anything, letters that are not Replayable, that are no longer in their
// dead-letter queue (replayed or removed since they were listed), or whose
// dead letter does not say where it was published (written by a consumer
// older than HeaderDLQOriginalExchange).
func (s *DeadLetters) Replay(ctx context.Context, letters []dlq.Letter) (int, error) {
	if len(letters) == 0 {
		return 0, nil
	}
	for _, l := range letters {
		if err := l.Replayable(); err != nil {
			return 0, err
		}
		if l.Destination != letters[0].Destination {
			return 0, fmt.Errorf("amqpconsumer: replay the letters of one dead-letter queue at a time (%s and %s)", letters[0].Destination, l.Destination)
		}
	}
	h, err := s.hold(ctx, letters[0].Destination)
	if err != nil {
		return 0, err
	}
	defer h.release()
	matched, err := h.match(letters)
	if err != nil {
		return 0, err
	}
	pub, err := s.publisher()
	if err != nil {
		return 0, err
	}
	defer pub.close()
	for i, d := range matched {
		if err := pub.send(ctx, d); err != nil {
			return i, fmt.Errorf("amqpconsumer: replaying dead letter %s of %s: %w", letters[i].Position, letters[i].Destination, err)
		}
		if err := h.ack(d); err != nil {
			return i + 1, fmt.Errorf("amqpconsumer: dead letter %s of %s was sent back but not removed (a later replay sends it again; consumers skip it as a duplicate): %w",
				letters[i].Position, letters[i].Destination, err)
		}
	}
	return len(matched), nil
}

// match finds the held delivery of each letter, each delivery used once.
func (h *held) match(letters []dlq.Letter) ([]amqp.Delivery, error) {
	used := make([]bool, len(h.deliveries))
	out := make([]amqp.Delivery, 0, len(letters))
	for _, l := range letters {
		found := -1
		for i, d := range h.deliveries {
			if !used[i] && sameLetter(l, fromDelivery(l.Destination, i, d)) {
				found = i
				break
			}
		}
		if found < 0 {
			return nil, fmt.Errorf("amqpconsumer: dead letter %s of %s is no longer in the queue (replayed or removed since it was listed); list again", l.Position, l.Destination)
		}
		d := h.deliveries[found]
		if _, ok := d.Headers[HeaderDLQOriginalExchange].(string); !ok {
			return nil, fmt.Errorf("amqpconsumer: dead letter %s of %s does not say which exchange it was published to (no %s header: written by an older consumer); replay event %d from the outbox instead: outbox events replay --from-id %d --to-id %d",
				l.Position, l.Destination, HeaderDLQOriginalExchange, l.EventID, l.EventID, l.EventID)
		}
		used[found] = true
		out = append(out, d)
	}
	return out, nil
}

// publisher is a channel in confirm mode that sees returned messages.
type publisher struct {
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
}

func (s *DeadLetters) publisher() (*publisher, error) {
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqpconsumer: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("amqpconsumer: %w", err)
	}
	// The server sends a basic.return before the confirm of the same
	// message, and the client hands them over in that order.
	return &publisher{ch: ch, confirms: ch.NotifyPublish(make(chan amqp.Confirmation, 1)), returns: ch.NotifyReturn(make(chan amqp.Return, 1))}, nil
}

func (p *publisher) close() { _ = p.ch.Close() }

// send publishes d as it was first published and waits for its confirm.
func (p *publisher) send(ctx context.Context, d amqp.Delivery) error {
	exchange, _ := d.Headers[HeaderDLQOriginalExchange].(string)
	key, _ := d.Headers[HeaderDLQOriginalRoutingKey].(string)
	hdrs := amqp.Table{}
	for k, v := range d.Headers {
		if !strings.HasPrefix(k, dlqHeaderPrefix) {
			hdrs[k] = v
		}
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultDeadLetterDeadline)
	defer cancel()
	err := p.ch.PublishWithContext(ctx, exchange, key, true, false, amqp.Publishing{
		Headers: hdrs, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
		MessageId: d.MessageId, Type: d.Type, Timestamp: d.Timestamp, AppId: d.AppId, Body: d.Body,
	})
	if err != nil {
		return err
	}
	select {
	case c, ok := <-p.confirms:
		if !ok || !c.Ack {
			return errors.New("the server did not confirm it")
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case r := <-p.returns:
		return fmt.Errorf("the server returned it: %s (no queue is bound to exchange %q for routing key %q)", r.ReplyText, exchange, key)
	default:
		return nil
	}
}
