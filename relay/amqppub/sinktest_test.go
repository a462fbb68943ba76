package amqppub_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/amqppub"
	"github.com/pgoutbox/outbox/relay/sinktest"
)

// sinkMaxBytes is the body limit the Publisher enforces in the suite
// (the server's own is 128 MiB).
const sinkMaxBytes = 100_000

// The RabbitMQ publisher passes the sink suite on the machine's server,
// each case on an exchange of its own, with the faults RabbitMQ can
// really show:
//   - a destination that fails for now: its queue is full with overflow
//     reject-publish (max-length 0), so the server nacks what reaches it;
//   - one message that fails for now: a headers exchange bound to the
//     case's exchange routes that event id alone to such a queue too;
//   - a destination refused: no queue is bound for its routing key, so
//     the mandatory message comes back (basic.return).
//
// RefuseMessage is not declared: RabbitMQ refuses one message for good
// only for its size (the SizeLimit case, and TestServerRefusesOversized)
// or its route (a destination's property).
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "rabbitmq", New: rabbitSink(nil)})
}

// With CloudEvents headers stamped, the publisher passes the same suite.
func TestSinkConformanceCloudEvents(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "rabbitmq-cloudevents", New: rabbitSink(&cloudevents.Config{Source: "urn:outbox:conformance"})})
}

func rabbitSink(ce *cloudevents.Config) func(t *testing.T) *sinktest.Sink {
	return func(t *testing.T) *sinktest.Sink { return rabbitSinkWith(t, ce) }
}

// queues stands for the consumers of a case: it binds a queue for each
// routing key the sink publishes to before the sink does, as consumers
// declare theirs before events flow, except for the keys a case refuses.
type queues struct {
	t        *testing.T
	conn     *amqp.Connection
	ch       *amqp.Channel
	exchange string

	mu      sync.Mutex
	bound   map[string]bool
	refused map[string]bool
}

func (q *queues) name(dest string) string { return q.exchange + "." + dest }

// bind declares dest's queue, with args, and binds it to dest's key.
func (q *queues) bind(dest string, args amqp.Table) {
	q.t.Helper()
	_, err := q.ch.QueueDeclare(q.name(dest), false, false, false, false, args)
	require.NoError(q.t, err)
	q.bound[dest] = true // for the cleanup, even if the binding fails
	require.NoError(q.t, q.ch.QueueBind(q.name(dest), dest, q.exchange, false, nil))
}

func (q *queues) ensure(msgs []relay.Message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range msgs {
		if !q.bound[m.Topic] && !q.refused[m.Topic] {
			q.bind(m.Topic, nil)
		}
	}
}

// boundSink is the sink under test, with its consumers' queues bound
// ahead of each call.
type boundSink struct {
	*amqppub.Publisher
	q *queues
}

func (s boundSink) Publish(ctx context.Context, msgs []relay.Message) []error {
	s.q.ensure(msgs)
	return s.Publisher.Publish(ctx, msgs)
}

func rabbitSinkWith(t *testing.T, ce *cloudevents.Config) *sinktest.Sink {
	t.Helper()
	conn := rabbittest.Dial(t, rabbittest.URL())
	var b [6]byte
	_, _ = rand.Read(b[:])
	q := &queues{t: t, conn: conn, ch: rabbittest.Channel(t, conn), exchange: "sinktest-" + hex.EncodeToString(b[:]),
		bound: map[string]bool{}, refused: map[string]bool{}}
	pub, err := amqppub.New(amqppub.Config{URL: rabbittest.URL(), Exchange: q.exchange, MaxBytes: sinkMaxBytes, CloudEvents: ce})
	require.NoError(t, err)
	// Ping declares the exchange, missing until now, for the queues.
	require.NoError(t, pub.Ping(context.Background()))
	t.Cleanup(func() {
		_ = pub.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		for dest := range q.bound {
			_, _ = ch.QueueDelete(q.name(dest), false, false, false)
		}
		_ = ch.ExchangeDelete(q.exchange, false, false)
	})
	return &sinktest.Sink{
		Sink:     boundSink{pub, q},
		Read:     func(t *testing.T, dest string, want int) []sinktest.Delivered { return read(t, q, dest, want) },
		MaxBytes: sinkMaxBytes,
		FailDestination: func(t *testing.T, dest string) func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			q.bind(dest, rejectAll)
			return func() {
				q.mu.Lock()
				defer q.mu.Unlock()
				_, err := q.ch.QueueDelete(q.name(dest), false, false, false)
				require.NoError(t, err)
				q.bind(dest, nil)
			}
		},
		RefuseDestination: func(t *testing.T, dest string) {
			q.mu.Lock()
			defer q.mu.Unlock()
			q.refused[dest] = true
			if q.bound[dest] {
				_, err := q.ch.QueueDelete(q.name(dest), false, false, false)
				require.NoError(t, err)
				delete(q.bound, dest)
			}
		},
		FailMessage: func(t *testing.T, dest string, id int64) func() { return failEvent(t, q, dest, id) },
	}
}

// rejectAll makes a queue refuse (nack) every message routed to it.
var rejectAll = amqp.Table{amqp.QueueMaxLenArg: 0, amqp.QueueOverflowArg: amqp.QueueOverflowRejectPublish}

// failEvent makes the server nack the message with event id id: a
// headers exchange, bound to the case's exchange for every key, routes
// that event id alone to a queue that rejects everything.
func failEvent(t *testing.T, q *queues, dest string, id int64) func() {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	hx := fmt.Sprintf("%s.fail-%d", q.exchange, id)
	t.Cleanup(func() {
		if ch, err := q.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(hx, false, false, false)
			_ = ch.ExchangeDelete(hx, false, false)
			_ = ch.Close()
		}
	})
	require.NoError(t, q.ch.ExchangeDeclare(hx, amqp.ExchangeHeaders, false, true, false, false, nil))
	require.NoError(t, q.ch.ExchangeBind(hx, dest, q.exchange, false, nil))
	_, err := q.ch.QueueDeclare(hx, false, false, false, false, rejectAll)
	require.NoError(t, err)
	require.NoError(t, q.ch.QueueBind(hx, "", hx, false, amqp.Table{"x-match": "all", outbox.HeaderEventID: strconv.FormatInt(id, 10)}))
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		_, err := q.ch.QueueDelete(hx, false, false, false)
		require.NoError(t, err)
		require.NoError(t, q.ch.ExchangeDelete(hx, false, false))
	}
}

// read takes what reached dest's queue and checks the AMQP properties
// the publisher sets beside the headers.
func read(t *testing.T, q *queues, dest string, want int) []sinktest.Delivered {
	t.Helper()
	var out []sinktest.Delivered
	for _, d := range rabbittest.Get(t, q.conn, q.name(dest), want, 250*time.Millisecond, 10*time.Second) {
		h := map[string]string{}
		for k, v := range d.Headers {
			s, ok := v.(string)
			require.True(t, ok, "header %q is a %T, want a string", k, v)
			h[k] = s
		}
		id, _ := strconv.ParseInt(h[outbox.HeaderEventID], 10, 64)
		require.Equal(t, h[outbox.HeaderEventID], d.MessageId, "message_id is the event id")
		require.Equal(t, h[outbox.HeaderEventType], d.Type, "type is the event type")
		require.Equal(t, outbox.ContentTypeJSON, d.ContentType)
		require.Equal(t, amqp.Persistent, d.DeliveryMode)
		require.Equal(t, dest, d.RoutingKey)
		out = append(out, sinktest.Delivered{ID: id, Key: h[outbox.HeaderAggregateID], Type: h[outbox.HeaderEventType],
			Payload: d.Body, Headers: h})
	}
	return out
}
