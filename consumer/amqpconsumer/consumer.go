// Package amqpconsumer consumes outbox events from a RabbitMQ queue with
// exactly-once effects: each message goes through a consumer.Dispatcher
// (dedupe in processed_events in the handler's transaction), and is
// acknowledged only after that transaction committed. A message that can
// never be processed is published to a dead-letter queue, with the reason
// in its headers, before it is acknowledged.
//
//	d, err := consumer.NewDispatcher(consumer.DispatcherConfig{Name: "billing", Pool: pool, System: "rabbitmq",
//		Handlers: map[string]consumer.Handler{"order.placed": onOrderPlaced}})
//	c, err := amqpconsumer.New(amqpconsumer.Config{URL: "amqp://guest:guest@127.0.0.1:5672/", Queue: "billing", Dispatcher: d})
//	err = c.Run(ctx)
package amqpconsumer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/internal/backoff"
)

// Defaults of Config, applied by WithDefaults.
const (
	DefaultPrefetch           = 256
	DefaultWorkers            = 8
	DefaultDeadLetterSuffix   = ".dlq"
	DefaultReconnectMin       = 100 * time.Millisecond
	DefaultReconnectMax       = 10 * time.Second
	DefaultShutdownGrace      = 10 * time.Second
	DefaultDeadLetterDeadline = 30 * time.Second
)

// The headers a dead letter carries, besides consumer.HeaderDLQError,
// HeaderDLQConsumer, HeaderDLQAttempts and HeaderDLQOriginalTopic (the
// queue), that say where the message was published: where a replay sends
// it back (see DeadLetters).
const (
	// HeaderDLQOriginalExchange is the exchange the message was published
	// to ("" for the default exchange).
	HeaderDLQOriginalExchange = "dlq_original_exchange"
	// HeaderDLQOriginalRoutingKey is the routing key it was published with.
	HeaderDLQOriginalRoutingKey = "dlq_original_routing_key"
)

// Config configures a Consumer.
type Config struct {
	// URL is the server: amqp://user:pass@host:5672/vhost. Required.
	URL string
	// Queue is the queue to consume; it must exist (bound to the
	// relayer's exchange). Required.
	Queue string
	// Dispatcher processes each message. Required.
	Dispatcher *consumer.Dispatcher
	// Prefetch is how many unacknowledged messages the server sends ahead
	// (basic.qos). Defaults to DefaultPrefetch (256).
	Prefetch int
	// Workers is how many messages are processed at once; the messages of
	// one aggregate always go to the same worker, in order. Defaults to
	// DefaultWorkers (8).
	Workers int
	// DeadLetterQueue receives the messages that can never be processed,
	// with the dlq_* headers saying why; declared durable when missing.
	// Defaults to Queue + DefaultDeadLetterSuffix (".dlq").
	DeadLetterQueue string
	// ShutdownGrace is how long a handler's transaction in flight may go
	// on to its commit once Run's context ends. Defaults to
	// DefaultShutdownGrace (10s).
	ShutdownGrace time.Duration
	// Logger receives connection events. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.Prefetch == 0 {
		cfg.Prefetch = DefaultPrefetch
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.DeadLetterQueue == "" && cfg.Queue != "" {
		cfg.DeadLetterQueue = cfg.Queue + DefaultDeadLetterSuffix
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Validate reports the first field of cfg a Consumer cannot use, saying
// what to set.
func (cfg Config) Validate() error {
	switch {
	case cfg.URL == "":
		return errors.New("amqpconsumer: URL is required: set it to amqp://user:pass@host:5672/vhost")
	case cfg.Queue == "":
		return errors.New("amqpconsumer: Queue is required: name the queue bound to the relayer's exchange")
	case cfg.Dispatcher == nil:
		return errors.New("amqpconsumer: Dispatcher is required: build one with consumer.NewDispatcher")
	case cfg.Prefetch < 0 || cfg.Prefetch > 65535:
		return fmt.Errorf("amqpconsumer: Prefetch is %d; use 1 to 65535, or 0 for the default (%d)", cfg.Prefetch, DefaultPrefetch)
	case cfg.Workers < 0:
		return fmt.Errorf("amqpconsumer: Workers is %d; use a positive number, or 0 for the default (%d)", cfg.Workers, DefaultWorkers)
	case cfg.DeadLetterQueue == cfg.Queue:
		return errors.New("amqpconsumer: DeadLetterQueue is Queue; name another queue, or leave it empty for Queue + \".dlq\"")
	case cfg.ShutdownGrace < 0:
		return errors.New("amqpconsumer: ShutdownGrace must not be negative")
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return fmt.Errorf("amqpconsumer: URL %q: %v", redact(cfg.URL), err)
	}
	return nil
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}

// Stats are a Consumer's cumulative counters.
type Stats struct {
	// Acked messages: processed, duplicates, or dead-lettered.
	Acked int64
	// DeadLettered messages, published to the dead-letter queue.
	DeadLettered int64
	// Reconnects after a lost connection or channel.
	Reconnects int64
}

// Consumer consumes one queue through a Dispatcher.
type Consumer struct {
	cfg Config
	log *slog.Logger

	acked, deadLettered, reconnects atomic.Int64
}

// New validates cfg, after applying its defaults.
func New(cfg Config) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, log: cfg.Logger.With("queue", cfg.Queue)}, nil
}

// Stats returns the cumulative counters.
func (c *Consumer) Stats() Stats {
	return Stats{Acked: c.acked.Load(), DeadLettered: c.deadLettered.Load(), Reconnects: c.reconnects.Load()}
}

// Run consumes until ctx ends, reconnecting with backoff when the
// connection or the channel is lost, and returns nil then. It returns an
// error only when it cannot start: the processed table or the queue is
// missing.
func (c *Consumer) Run(ctx context.Context) error {
	if err := c.cfg.Dispatcher.Check(ctx); err != nil {
		return err
	}
	for attempt := 0; ctx.Err() == nil; attempt++ {
		started, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var ae *amqp.Error
		if !started && errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fmt.Errorf("amqpconsumer: %w; declare the queue and bind it to the relayer's exchange", err)
		}
		if started {
			attempt = 0
		}
		c.reconnects.Add(1)
		delay := backoff.Delay(DefaultReconnectMin, DefaultReconnectMax, attempt+1)
		c.log.Warn("amqp consumer lost its connection; reconnecting", "err", err, "retry_in", delay.Round(time.Millisecond))
		if !backoff.Sleep(ctx, delay) {
			return nil
		}
	}
	return nil
}

// session consumes on one connection until it fails or ctx ends; started
// says whether consuming began.
func (c *Consumer) session(ctx context.Context) (started bool, err error) {
	conn, err := amqp.DialConfig(c.cfg.URL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return false, fmt.Errorf("cannot connect to %s: %w", redact(c.cfg.URL), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	dlq, err := c.deadLetterChannel(conn)
	if err != nil {
		return false, err
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return false, err
	}
	deliveries, err := ch.Consume(c.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return false, err
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	return true, c.consume(ctx, deliveries, dlq, closed)
}

// consume hands deliveries to the workers, each aggregate to one of
// them, until the deliveries end or ctx does, then waits for the workers.
func (c *Consumer) consume(ctx context.Context, deliveries <-chan amqp.Delivery, dlq *deadLetters, closed chan *amqp.Error) error {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	lanes := make([]chan amqp.Delivery, c.cfg.Workers)
	var wg sync.WaitGroup
	for i := range lanes {
		lanes[i] = make(chan amqp.Delivery, c.cfg.Prefetch)
		wg.Go(func() {
			for d := range lanes[i] {
				c.handle(ctx, work, d, dlq)
			}
		})
	}
	defer func() {
		for _, l := range lanes {
			close(l)
		}
		// A handler in flight may commit within the grace period; then
		// work ends, and what is left is redelivered.
		stop := time.AfterFunc(c.cfg.ShutdownGrace, cancelWork)
		wg.Wait()
		stop.Stop()
	}()
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("the server closed the delivery channel: %v", <-closed)
			}
			lanes[lane(d, len(lanes))] <- d
		case <-ctx.Done():
			return nil
		}
	}
}

// lane picks the worker of d's aggregate.
func lane(d amqp.Delivery, n int) int {
	key, _ := d.Headers[outbox.HeaderAggregateID].(string)
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// handle dispatches one message and settles it: ack once it is done, or
// once it is in the dead-letter queue; nothing when stopped (the server
// redelivers it).
func (c *Consumer) handle(stop, work context.Context, d amqp.Delivery, dlq *deadLetters) {
	res := c.cfg.Dispatcher.Dispatch(stop, work, delivery(c.cfg.Queue, d))
	switch res.Verdict {
	case consumer.Done:
	case consumer.DeadLetter:
		if err := dlq.publish(work, d, res, c.cfg.Dispatcher.Config().Name, c.cfg.Queue); err != nil {
			c.log.Error("cannot dead-letter a message; leaving it unacknowledged for redelivery", "message_id", d.MessageId, "err", err)
			return
		}
		c.deadLettered.Add(1)
	default:
		return
	}
	if err := d.Ack(false); err != nil {
		c.log.Warn("ack failed; the message will be redelivered and deduplicated", "message_id", d.MessageId, "err", err)
		return
	}
	c.acked.Add(1)
}

// delivery is d as the Dispatcher reads it: string headers (other AMQP
// values in their text form), the aggregate id from its header.
func delivery(queue string, d amqp.Delivery) consumer.Delivery {
	h := make(map[string]string, len(d.Headers))
	for k, v := range d.Headers {
		switch v := v.(type) {
		case string:
			h[k] = v
		case []byte:
			h[k] = string(v)
		default:
			h[k] = fmt.Sprint(v)
		}
	}
	if d.ContentType != "" {
		h[outbox.HeaderContentType] = d.ContentType // the relayer sends it as the property
	}
	return consumer.Delivery{Topic: queue, Key: h[outbox.HeaderAggregateID], Payload: d.Body, Headers: h}
}

// deadLetters publishes to the dead-letter queue on a channel of its own,
// in confirm mode.
type deadLetters struct {
	mu       sync.Mutex
	ch       *amqp.Channel
	queue    string
	confirms chan amqp.Confirmation
}

func (c *Consumer) deadLetterChannel(conn *amqp.Connection) (*deadLetters, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if _, err := ch.QueueDeclare(c.cfg.DeadLetterQueue, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("cannot declare dead-letter queue %q: %w", c.cfg.DeadLetterQueue, err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	return &deadLetters{ch: ch, queue: c.cfg.DeadLetterQueue, confirms: ch.NotifyPublish(make(chan amqp.Confirmation, 1))}, nil
}

// publish copies d, with its headers and the dlq_* ones, to the
// dead-letter queue and waits for the server's confirm.
func (q *deadLetters) publish(ctx context.Context, d amqp.Delivery, res consumer.Result, name, queue string) error {
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	reason := res.Reason
	if len(reason) > 4<<10 {
		reason = reason[:4<<10]
	}
	h[consumer.HeaderDLQError] = reason
	h[consumer.HeaderDLQConsumer] = name
	h[consumer.HeaderDLQAttempts] = strconv.Itoa(res.Attempts)
	h[consumer.HeaderDLQOriginalTopic] = queue
	h[HeaderDLQOriginalExchange] = d.Exchange
	h[HeaderDLQOriginalRoutingKey] = d.RoutingKey
	q.mu.Lock()
	defer q.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, DefaultDeadLetterDeadline)
	defer cancel()
	err := q.ch.PublishWithContext(ctx, "", q.queue, true, false, amqp.Publishing{
		Headers: h, ContentType: d.ContentType, DeliveryMode: amqp.Persistent, MessageId: d.MessageId, Type: d.Type, Body: d.Body,
	})
	if err != nil {
		return err
	}
	select {
	case c, ok := <-q.confirms:
		if !ok || !c.Ack {
			return errors.New("the server did not confirm the dead letter")
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
