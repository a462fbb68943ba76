// Package redisconsumer consumes the streams of the Redis sink
// (relay/redispub) with exactly-once effects: a consumer group reads the
// entries (XREADGROUP), consumer.Dispatcher processes each (dedupe in
// processed_events in the handler's transaction), and an entry is
// acknowledged (XACK) only after its transaction committed, or after it
// was written to the dead-letter stream. Entries a dead consumer of the
// group left pending are claimed (XAUTOCLAIM) once idle for ClaimIdle.
//
//	c, err := redisconsumer.New(redisconsumer.Config{
//		Client:     redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}),
//		Streams:    []string{"order"},
//		Dispatcher: consumer.DispatcherConfig{Name: "billing", Pool: pool, Handlers: handlers},
//	})
//	err = c.Run(ctx)
package redisconsumer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/routing"
)

// Defaults of Config.
const (
	DefaultCount            = 100
	DefaultBlock            = 2 * time.Second
	DefaultClaimIdle        = time.Minute
	DefaultConcurrency      = 8
	DefaultDeadLetterSuffix = ":dlq"
	DefaultShutdownGrace    = 10 * time.Second
)

// Fields a dead letter carries besides the entry's own.
const (
	// FieldDLQReason says why the entry was dead-lettered.
	FieldDLQReason = "dlq_reason"
	// FieldDLQStream is the stream the entry came from.
	FieldDLQStream = "dlq_stream"
	// FieldDLQID is the entry's id in that stream.
	FieldDLQID = "dlq_id"
)

// Config configures a Consumer.
type Config struct {
	// Client connects to the Redis server the relay publishes to. Required.
	Client *redis.Client
	// Streams are the stream keys to consume (the relay's topics). Required.
	Streams []string
	// Dispatcher is the processing core's configuration; its System
	// defaults to "redis" here. Name, Pool and handlers are required.
	Dispatcher consumer.DispatcherConfig
	// Group is the consumer group, created at the start of each stream
	// (and the stream with it) when missing. Defaults to Dispatcher.Name.
	Group string
	// Consumer names this process in the group; its pending entries are
	// read again when a process of the same name starts. Defaults to the
	// host name and process id.
	Consumer string
	// Count is the most entries one XREADGROUP returns. Defaults to
	// DefaultCount (100).
	Count int64
	// Block is how long XREADGROUP waits for entries. Defaults to
	// DefaultBlock (2s).
	Block time.Duration
	// ClaimIdle is how long an entry stays pending with another consumer
	// before this one claims it (XAUTOCLAIM): longer than the slowest
	// handler with its retries. Defaults to DefaultClaimIdle (1m).
	ClaimIdle time.Duration
	// Concurrency is how many aggregates are processed at once; one
	// aggregate's entries are processed one after the other, in stream
	// order. Defaults to DefaultConcurrency (8).
	Concurrency int
	// DeadLetterSuffix makes the dead-letter stream of a stream: its key
	// followed by this. Defaults to DefaultDeadLetterSuffix (":dlq").
	DeadLetterSuffix string
	// ShutdownGrace is how long the transaction in flight may take to
	// commit once Run's context ends. Defaults to DefaultShutdownGrace (10s).
	ShutdownGrace time.Duration
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.Dispatcher.System == "" {
		cfg.Dispatcher.System = "redis"
	}
	cfg.Dispatcher = cfg.Dispatcher.WithDefaults()
	if cfg.Group == "" {
		cfg.Group = cfg.Dispatcher.Name
	}
	if cfg.Consumer == "" {
		host, _ := os.Hostname()
		cfg.Consumer = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if cfg.Count == 0 {
		cfg.Count = DefaultCount
	}
	if cfg.Block == 0 {
		cfg.Block = DefaultBlock
	}
	if cfg.ClaimIdle == 0 {
		cfg.ClaimIdle = DefaultClaimIdle
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.DeadLetterSuffix == "" {
		cfg.DeadLetterSuffix = DefaultDeadLetterSuffix
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	return cfg
}

// Validate reports the first field of cfg (with its defaults applied)
// that a Consumer cannot use, saying what to set.
func (cfg Config) Validate() error {
	switch {
	case cfg.Client == nil:
		return errors.New("redisconsumer: Client is nil; pass a *redis.Client for the server the relay publishes to")
	case len(cfg.Streams) == 0:
		return errors.New("redisconsumer: Streams is empty; name the stream keys to consume (the relay's topics, e.g. \"order\")")
	case cfg.Group == "":
		return errors.New("redisconsumer: Group is empty; set it or Dispatcher.Name")
	case cfg.Count < 0, cfg.Block < 0, cfg.ClaimIdle < 0, cfg.Concurrency < 0, cfg.ShutdownGrace < 0:
		return errors.New("redisconsumer: Count, Block, ClaimIdle, Concurrency and ShutdownGrace must be positive, or 0 for their defaults")
	}
	for _, s := range cfg.Streams {
		if strings.HasSuffix(s, cfg.DeadLetterSuffix) {
			return fmt.Errorf("redisconsumer: stream %q is a dead-letter stream (suffix %q); consume the stream it came from, and replay dead letters to it", s, cfg.DeadLetterSuffix)
		}
	}
	return cfg.Dispatcher.Validate()
}

// Consumer reads a consumer group's entries and processes them.
type Consumer struct {
	cfg  Config
	disp *consumer.Dispatcher
}

// New validates cfg, applies its defaults and builds the Dispatcher.
func New(cfg Config) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d, err := consumer.NewDispatcher(cfg.Dispatcher)
	if err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, disp: d}, nil
}

// Stats returns the Dispatcher's counters.
func (c *Consumer) Stats() consumer.DispatcherStats { return c.disp.Stats() }

// Run creates the groups, then processes entries until ctx ends: first
// its own pending entries (left by a process of the same Consumer name),
// then those idle with dead consumers, then new ones. It returns nil when
// ctx ends, or the error that keeps it from going on.
func (c *Consumer) Run(ctx context.Context) error {
	if err := c.disp.Check(ctx); err != nil {
		return err
	}
	for _, s := range c.cfg.Streams {
		err := c.cfg.Client.XGroupCreateMkStream(ctx, s, c.cfg.Group, "0").Err()
		if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
			return fmt.Errorf("redisconsumer: creating group %q on stream %q: %w", c.cfg.Group, s, err)
		}
	}
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownGrace, cancelWork) })
	defer stop()
	own := true
	lastClaim := time.Time{}
	for ctx.Err() == nil {
		var streams []redis.XStream
		var err error
		switch {
		case own:
			streams, err = c.read(ctx, "0")
			own = entries(streams) > 0
		case time.Since(lastClaim) >= c.cfg.ClaimIdle/2:
			lastClaim = time.Now()
			streams, err = c.claim(ctx)
		default:
			streams, err = c.read(ctx, ">")
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.cfg.Dispatcher.Logger.Warn("redisconsumer: reading entries failed; retrying", "error", err)
			sleep(ctx, time.Second)
			continue
		}
		c.process(ctx, work, streams)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func entries(streams []redis.XStream) int {
	n := 0
	for _, s := range streams {
		n += len(s.Messages)
	}
	return n
}

// read is XREADGROUP from id on every stream: ">" for new entries, "0"
// for this consumer's pending ones.
func (c *Consumer) read(ctx context.Context, id string) ([]redis.XStream, error) {
	args := &redis.XReadGroupArgs{Group: c.cfg.Group, Consumer: c.cfg.Consumer, Count: c.cfg.Count}
	args.Streams = append(args.Streams, c.cfg.Streams...)
	for range c.cfg.Streams {
		args.Streams = append(args.Streams, id)
	}
	if id == ">" {
		args.Block = c.cfg.Block
	} else {
		args.Block = -1
	}
	streams, err := c.cfg.Client.XReadGroup(ctx, args).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return streams, err
}

// claim takes over the entries of every stream that other consumers of
// the group have left pending for ClaimIdle.
func (c *Consumer) claim(ctx context.Context) ([]redis.XStream, error) {
	var out []redis.XStream
	for _, s := range c.cfg.Streams {
		msgs, _, err := c.cfg.Client.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: s, Group: c.cfg.Group,
			Consumer: c.cfg.Consumer, MinIdle: c.cfg.ClaimIdle, Start: "0-0", Count: c.cfg.Count}).Result()
		if err != nil {
			return out, err
		}
		if len(msgs) > 0 {
			out = append(out, redis.XStream{Stream: s, Messages: msgs})
		}
	}
	return out, nil
}

// process dispatches the entries, each aggregate's in stream order on one
// goroutine, at most Concurrency aggregates at once, and acknowledges each
// once it is settled.
func (c *Consumer) process(stop, work context.Context, streams []redis.XStream) {
	sem := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, s := range streams {
		byAgg := map[string][]redis.XMessage{}
		var order []string
		for _, m := range s.Messages {
			k, _ := m.Values[outbox.HeaderAggregateID].(string)
			if _, ok := byAgg[k]; !ok {
				order = append(order, k)
			}
			byAgg[k] = append(byAgg[k], m)
		}
		for _, k := range order {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				for _, m := range byAgg[k] {
					if !c.settle(stop, work, s.Stream, m) {
						return // stopped: the rest stay pending, in order
					}
				}
			})
		}
	}
	wg.Wait()
}

// settle dispatches one entry and acknowledges it when it is done or
// dead-lettered; false when it was left pending.
func (c *Consumer) settle(stop, work context.Context, stream string, m redis.XMessage) bool {
	res := c.disp.Dispatch(stop, work, delivery(stream, m))
	switch res.Verdict {
	case consumer.Done:
	case consumer.DeadLetter:
		if err := c.deadLetter(work, stream, m, res.Reason); err != nil {
			c.cfg.Dispatcher.Logger.Error("redisconsumer: writing a dead letter failed; the entry stays pending and is read again",
				"stream", stream, "entry_id", m.ID, "error", err)
			return false
		}
	default:
		return false
	}
	if err := c.cfg.Client.XAck(work, stream, c.cfg.Group, m.ID).Err(); err != nil {
		// Processed (or dead-lettered) but not acknowledged: it comes again,
		// and dedupe makes it a duplicate.
		c.cfg.Dispatcher.Logger.Warn("redisconsumer: XACK failed", "stream", stream, "entry_id", m.ID, "error", err)
	}
	return true
}

// deadLetter adds the entry, with why and where from, to its stream's
// dead-letter stream.
func (c *Consumer) deadLetter(ctx context.Context, stream string, m redis.XMessage, reason string) error {
	vals := make([]any, 0, 2*len(m.Values)+6)
	for k, v := range m.Values {
		vals = append(vals, k, v)
	}
	vals = append(vals, FieldDLQReason, reason, FieldDLQStream, stream, FieldDLQID, m.ID)
	return c.cfg.Client.XAdd(ctx, &redis.XAddArgs{Stream: stream + c.cfg.DeadLetterSuffix, Values: vals}).Err()
}

// delivery is an entry as the Dispatcher takes it: the relay's fields as
// headers, the header: fields as the event's own.
func delivery(stream string, m redis.XMessage) consumer.Delivery {
	d := consumer.Delivery{Topic: stream, Headers: map[string]string{}}
	for k, v := range m.Values {
		s, _ := v.(string)
		switch {
		case k == routing.RedisPayloadField:
			d.Payload = []byte(s)
		case k == outbox.HeaderAggregateID:
			d.Key = s
		case strings.HasPrefix(k, routing.RedisHeaderPrefix):
			name := strings.TrimPrefix(k, routing.RedisHeaderPrefix)
			if !outbox.IsReservedHeader(name) {
				d.Headers[name] = s
			}
		default:
			d.Headers[k] = s
		}
	}
	return d
}
