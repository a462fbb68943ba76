// Package natsconsumer consumes the NATS sink's events from a JetStream
// durable pull consumer with exactly-once effects: each message goes
// through a consumer.Dispatcher (dedupe in processed_events in the
// handler's own transaction, retries, dead-letter verdict) and is
// acknowledged only after its transaction committed.
//
//	c, err := natsconsumer.New(js, natsconsumer.Config{
//		Stream: "ORDERS",
//		Dispatcher: consumer.DispatcherConfig{Name: "billing", Pool: pool,
//			Handlers: map[string]consumer.Handler{"order.placed": onPlaced}},
//	})
//	...
//	err = c.Run(ctx)
//
// Messages of one aggregate (the aggregate_id header) are processed one
// after the other, in stream order; different aggregates in parallel
// (Config.Workers lanes). A message that can never be processed is
// published to the dead-letter subject (DeadLetterPrefix followed by its
// subject), with why, and then terminated (AckTerm), so that it is never
// redelivered and never stalls the ones behind it.
package natsconsumer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/routing"
)

// Defaults of Config.
const (
	DefaultWorkers          = 8
	DefaultDeadLetterPrefix = "dlq."
	DefaultAckWait          = 30 * time.Second
	DefaultShutdownGrace    = 10 * time.Second
)

// Headers a dead letter carries besides the original message's.
const (
	HeaderDLQError           = "dlq_error"
	HeaderDLQConsumer        = "dlq_consumer"
	HeaderDLQAttempts        = "dlq_attempts"
	HeaderDLQOriginalSubject = "dlq_original_subject"
	HeaderDLQOriginalSeq     = "dlq_original_sequence"
)

// Config configures a Consumer.
type Config struct {
	// Dispatcher is the processing core's configuration: the consumer's
	// name (also the durable consumer's, unless Durable is set), its pool
	// and handlers. Its System defaults to "nats" here. Required.
	Dispatcher consumer.DispatcherConfig
	// Stream is the JetStream stream to consume. Required.
	Stream string
	// Durable names the durable pull consumer, created if missing.
	// Defaults to Dispatcher.Name.
	Durable string
	// FilterSubjects limits the consumer to these subjects (wildcards
	// allowed). Defaults to none: every subject of the stream.
	FilterSubjects []string
	// Workers is how many aggregates are processed at once; a pool
	// connection each. Defaults to DefaultWorkers (8).
	Workers int
	// DeadLetterPrefix goes before a message's subject to make its dead
	// letter's; a stream must capture that subject. Defaults to
	// DefaultDeadLetterPrefix ("dlq.").
	DeadLetterPrefix string
	// AckWait is how long the server waits for an acknowledgement before
	// redelivering; a message being processed is kept in progress meanwhile.
	// Defaults to DefaultAckWait (30s).
	AckWait time.Duration
	// ShutdownGrace is how long Run lets the transactions in flight commit
	// once ctx ends. Defaults to DefaultShutdownGrace (10s).
	ShutdownGrace time.Duration
	// Logger receives structured logs. Defaults to
	// Dispatcher.Logger, else slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.Dispatcher.System == "" {
		cfg.Dispatcher.System = "nats"
	}
	if cfg.Durable == "" {
		cfg.Durable = cfg.Dispatcher.Name
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.DeadLetterPrefix == "" {
		cfg.DeadLetterPrefix = DefaultDeadLetterPrefix
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = DefaultAckWait
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = cfg.Dispatcher.Logger
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Dispatcher.Logger = cfg.Logger
	return cfg
}

// Validate reports the first field of cfg (defaults applied) a Consumer
// cannot use, saying what to set.
func (cfg Config) Validate() error {
	switch {
	case cfg.Stream == "":
		return errors.New("natsconsumer: Config.Stream is empty; name the JetStream stream the relay publishes to")
	case cfg.Durable == "":
		return errors.New("natsconsumer: Config.Durable is empty and so is Dispatcher.Name; name the consumer")
	case cfg.Workers < 1:
		return fmt.Errorf("natsconsumer: Workers is %d; use a positive number, or 0 for %d", cfg.Workers, DefaultWorkers)
	case cfg.AckWait < time.Second:
		return fmt.Errorf("natsconsumer: AckWait is %s; use at least 1s, or 0 for %s", cfg.AckWait, DefaultAckWait)
	case cfg.ShutdownGrace < 0:
		return fmt.Errorf("natsconsumer: ShutdownGrace is %s; use a positive duration, or 0 for %s", cfg.ShutdownGrace, DefaultShutdownGrace)
	}
	return nil
}

// Consumer is a JetStream durable pull consumer on a consumer.Dispatcher.
type Consumer struct {
	cfg  Config
	js   jetstream.JetStream
	disp *consumer.Dispatcher
	log  *slog.Logger
}

// New checks cfg and builds the Dispatcher; Run creates the durable
// consumer.
func New(js jetstream.JetStream, cfg Config) (*Consumer, error) {
	if js == nil {
		return nil, errors.New("natsconsumer: js is nil; pass jetstream.New(nc)")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	disp, err := consumer.NewDispatcher(cfg.Dispatcher)
	if err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, js: js, disp: disp, log: cfg.Logger.With("consumer", cfg.Dispatcher.Name, "stream", cfg.Stream)}, nil
}

// Stats returns the Dispatcher's counters.
func (c *Consumer) Stats() consumer.DispatcherStats { return c.disp.Stats() }

// Run consumes until ctx ends, then lets the transactions in flight
// commit (within ShutdownGrace) and returns nil; it returns an error when
// it cannot start (no processed table, no stream).
func (c *Consumer) Run(ctx context.Context) error {
	if err := c.disp.Check(ctx); err != nil {
		return err
	}
	cc := jetstream.ConsumerConfig{
		Durable: c.cfg.Durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: c.cfg.AckWait,
		MaxAckPending: 64 * c.cfg.Workers,
		// Redeliveries are this consumer's to decide: it dead-letters.
		MaxDeliver: -1,
	}
	if len(c.cfg.FilterSubjects) == 1 {
		// One filter in the form every server version takes (several
		// need nats-server 2.10).
		cc.FilterSubject = c.cfg.FilterSubjects[0]
	} else {
		cc.FilterSubjects = c.cfg.FilterSubjects
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	cons, err := c.js.CreateOrUpdateConsumer(cctx, c.cfg.Stream, cc)
	cancel()
	if err != nil {
		return fmt.Errorf("natsconsumer: durable consumer %q on stream %q: %w", c.cfg.Durable, c.cfg.Stream, err)
	}
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	lanes := make([]chan jetstream.Msg, c.cfg.Workers)
	var wg sync.WaitGroup
	for i := range lanes {
		lanes[i] = make(chan jetstream.Msg, 64)
		wg.Go(func() {
			for m := range lanes[i] {
				c.handle(ctx, work, m)
			}
		})
	}
	msgs, err := cons.Messages(jetstream.PullMaxMessages(32 * c.cfg.Workers))
	if err != nil {
		return fmt.Errorf("natsconsumer: %w", err)
	}
	go func() { <-ctx.Done(); msgs.Stop() }()
	c.log.Info("consuming", "durable", c.cfg.Durable, "filter_subjects", c.cfg.FilterSubjects)
	for {
		m, err := msgs.Next()
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("stopped receiving", "err", err)
			}
			break // stopped (or the connection closed)
		}
		select {
		case lanes[lane(m, len(lanes))] <- m:
		case <-ctx.Done():
		}
	}
	for _, l := range lanes {
		close(l)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(c.cfg.ShutdownGrace):
		cancelWork()
		<-done
	}
	return nil
}

// lane is m's aggregate's lane: one aggregate's messages go through one
// lane, in order.
func lane(m jetstream.Msg, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(m.Headers().Get(outbox.HeaderAggregateID)))
	return int(h.Sum32() % uint32(n))
}

// delivery is m as the Dispatcher reads it: the event's own headers
// unescaped, the relayer's first values.
func delivery(m jetstream.Msg) consumer.Delivery {
	h := make(map[string]string, len(m.Headers()))
	for k, vs := range m.Headers() {
		if len(vs) == 0 || k == routing.HeaderNATSMsgID {
			continue
		}
		name, value, err := routing.UnescapeNATSHeader(k, vs[0])
		if err != nil {
			name, value = k, vs[0]
		}
		h[name] = value
	}
	return consumer.Delivery{Topic: m.Subject(), Key: h[outbox.HeaderAggregateID], Payload: m.Data(), Headers: h}
}

// handle dispatches m, keeping it in progress at the server meanwhile, and
// settles it: acknowledged once processed, dead-lettered then terminated,
// or left to be redelivered when stopping.
func (c *Consumer) handle(stop, work context.Context, m jetstream.Msg) {
	keep, cancel := context.WithCancel(work)
	defer cancel()
	go func() {
		t := time.NewTicker(c.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-keep.Done():
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	res := c.disp.Dispatch(stop, work, delivery(m))
	switch res.Verdict {
	case consumer.Done:
		if err := m.DoubleAck(work); err != nil {
			// Committed: a redelivery is skipped as a duplicate.
			c.log.Warn("acknowledgement not confirmed; the message may come again and be skipped", "subject", m.Subject(), "err", err)
		}
	case consumer.DeadLetter:
		if c.deadLetter(stop, m, res) {
			_ = m.Term()
		}
	default:
		_ = m.Nak()
	}
}

// deadLetter publishes m to its dead-letter subject with why, retrying
// until the stream acknowledges it or stop ends (then m is redelivered).
func (c *Consumer) deadLetter(stop context.Context, m jetstream.Msg, res consumer.Result) bool {
	dl := &nats.Msg{Subject: c.cfg.DeadLetterPrefix + m.Subject(), Data: m.Data(), Header: nats.Header{}}
	for k, vs := range m.Headers() {
		if k != routing.HeaderNATSMsgID {
			dl.Header[k] = vs
		}
	}
	seq := uint64(0)
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	// NATS turns CR and LF in a value into spaces: fine for a reason.
	dl.Header.Set(HeaderDLQError, res.Reason)
	dl.Header.Set(HeaderDLQConsumer, c.cfg.Dispatcher.Name)
	dl.Header.Set(HeaderDLQAttempts, strconv.Itoa(res.Attempts))
	dl.Header.Set(HeaderDLQOriginalSubject, m.Subject())
	dl.Header.Set(HeaderDLQOriginalSeq, strconv.FormatUint(seq, 10))
	// One dead letter per original message and consumer, however often
	// this is retried.
	dl.Header.Set(routing.HeaderNATSMsgID, fmt.Sprintf("dlq:%s:%s:%d", c.cfg.Dispatcher.Name, c.cfg.Stream, seq))
	for n := 1; ; n++ {
		ctx, cancel := context.WithTimeout(stop, 10*time.Second)
		_, err := c.js.PublishMsg(ctx, dl)
		cancel()
		if err == nil {
			return true
		}
		c.log.Error("cannot write the dead letter; retrying (a stream must capture the dead-letter subject)", "subject", dl.Subject, "err", err)
		if !backoff.Sleep(stop, backoff.Delay(100*time.Millisecond, 5*time.Second, n)) {
			return false
		}
	}
}
