package consumer

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/commithook"
	"github.com/pgoutbox/outbox/kafka"
)

// Stats are cumulative counters since the Consumer was created.
type Stats struct {
	// Records received from Kafka, including redeliveries, and records
	// polled again after a rebalance or shutdown cut their poll short.
	Records int64
	// Processed events: their handler ran and committed.
	Processed int64
	// Duplicates: already processed by this consumer name; skipped.
	Duplicates int64
	// DeadLettered records written to a dead-letter topic, whole or as a
	// pointer record (see HeaderDLQValueDropped), Malformed ones included.
	DeadLettered int64
	// Malformed records: no or bad event_id, an event_source or
	// event_type that is not valid UTF-8 or holds NUL, payload not JSON
	// (or not UTF-8), or a type with no handler.
	Malformed int64
	// DeadLetterDropped: records whose dead letter the broker refused even
	// as a pointer record (a key too large for the dead-letter topic). Each
	// is logged with its topic, partition and offset, and skipped.
	DeadLetterDropped int64
	// Retries: a record tried again after its handler failed, lost a
	// deadlock, or the database was unreachable.
	Retries int64
}

// Consumer is a Kafka group consumer that applies each event's effects
// once per consumer name. Create it with New and run it with Run.
type Consumer struct {
	cfg     Config
	disp    *Dispatcher // handlers, retries, spans
	proc    *Processor
	log     *slog.Logger
	opts    []kgo.Opt // the group consumer's
	dlqOpts []kgo.Opt // the dead-letter producer's
	dlq     map[string]string

	started atomic.Bool
	client  *kgo.Client
	dlqCl   *kgo.Client
	hurry   chan struct{}

	followed map[string]time.Time // when a recreated topic was last purged and added back (consume's goroutine only)

	mu          sync.Mutex
	uncommitted map[string]map[int32]*kgo.Record // last done record per partition, not yet committed
	crashed     error                            // set when beforeCommit stopped the consumer
	held        []string                         // recreated topics whose offsets are not committed (holdOffsets)

	// beforeCommit is the tests' crash point (internal/commithook), read
	// from Run's context.
	beforeCommit commithook.Func

	records, deadLettered, deadLetterDropped, malformed atomic.Int64
}

// New validates cfg and applies its defaults.
func New(cfg Config) (*Consumer, error) {
	proc, err := NewProcessor(ProcessorConfig{Name: cfg.Name, Pool: cfg.Pool, Tables: cfg.Tables})
	if err != nil {
		return nil, err
	}
	cfg.Tables = proc.Config().Tables
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dlq, err := cfg.deadLetters()
	if err != nil {
		return nil, err
	}
	disp, err := newDispatcher(proc, DispatcherConfig{Name: cfg.Name, Pool: cfg.Pool, Tables: cfg.Tables,
		Handlers: cfg.Handlers, DefaultHandler: cfg.DefaultHandler, Middleware: cfg.Middleware,
		MaxAttempts: cfg.MaxAttempts, BackoffMin: cfg.BackoffMin, BackoffMax: cfg.BackoffMax,
		Logger: cfg.Logger, TracerProvider: cfg.TracerProvider, Propagator: cfg.Propagator})
	if err != nil {
		return nil, err
	}

	// The spans name the Kafka consumer group.
	disp.tracing.group = cfg.Group
	c := &Consumer{
		cfg:         cfg,
		disp:        disp,
		proc:        proc,
		log:         cfg.Logger.With("consumer", cfg.Name),
		dlq:         dlq,
		hurry:       make(chan struct{}, 1),
		uncommitted: map[string]map[int32]*kgo.Record{},
	}

	if cfg.Client.Logger == nil {
		cfg.Client.Logger = c.log
	}
	base, err := cfg.Client.Options()
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	c.opts = append(c.groupOptions(), base...)
	// Dead letters go through a client of their own: a produce error makes
	// a client refresh its metadata, which a consumer client holding a
	// poll (BlockRebalanceOnPoll) can make wait.
	c.dlqOpts = append(kafka.ProducerOptions(), base...)
	return c, nil
}

// groupOptions are the group consumer's own options, before the user's
// Client.Opts.
func (c *Consumer) groupOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		// A new group reads from the start, so no event is missed.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// franz-go's default (50 MiB a fetch) lets a consumer working
		// through a backlog hold many times the memory it needs; 1 MiB
		// keeps it small without slowing the consumer down. A record
		// batch larger than this is still returned whole.
		kgo.FetchMaxBytes(1 << 20),
		// Offsets are committed by hand, only past records whose
		// transaction committed.
		kgo.DisableAutoCommit(),
		// A rebalance waits until a poll's records are done and their
		// offsets committed, so a commit never lands on a partition this
		// member no longer owns. OnPartitionsCallbackBlocked tells us a
		// rebalance is waiting, and we cut the poll short.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsCallbackBlocked(c.onBlocked),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		// Kafka's own clients retry after 100ms doubling to 1s
		// (retry.backoff.max.ms); franz-go's default doubles to 5s. A
		// partition whose fetches fail backs off that long each time,
		// and franz-go hands UNKNOWN_TOPIC_ID (a recreated topic, or a
		// replaced broker: see follow) to a poll only after five failed
		// fetches, so with franz-go's backoff the consumer takes several
		// times as long to follow the new topic.
		kgo.RetryBackoffFn(func(fails int) time.Duration {
			return backoff.Delay(100*time.Millisecond, time.Second, fails)
		}),
	}
}

// Config returns the configuration with defaults applied.
func (c *Consumer) Config() Config { return c.cfg }

// Stats returns the cumulative counters.
func (c *Consumer) Stats() Stats {
	ps := c.proc.Stats()
	return Stats{
		Records:           c.records.Load(),
		Processed:         ps.Processed,
		Duplicates:        ps.Duplicates,
		DeadLettered:      c.deadLettered.Load(),
		Malformed:         c.malformed.Load(),
		DeadLetterDropped: c.deadLetterDropped.Load(),
		Retries:           c.disp.Stats().Retries,
	}
}

// Processor returns the processing core the consumer runs on, for
// processing events that arrive some other way under the same name.
func (c *Consumer) Processor() *Processor { return c.proc }

func (c *Consumer) decode(r *kgo.Record) item {
	ev, bad := decode(r)
	if bad == nil {
		bad = c.disp.route(ev)
	}
	return item{rec: r, ev: ev, bad: bad}
}
