package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/kafka"
)

// Defaults of Config that `outbox consume` names in its flags' help.
const (
	DefaultBatchSize   = 100
	DefaultConcurrency = 1
)

// Config configures a Consumer.
type Config struct {
	// Name is the consumer's name: events are deduplicated per name, and
	// it is the Kafka consumer group unless Group is set. Required.
	Name string
	// Pool connects to the database that holds the processed table and the
	// tables the handlers write. It needs at least Concurrency
	// connections, plus one for the checks that tell a database outage
	// from a failing handler. Required.
	Pool *pgxpool.Pool
	// Tables names the processed table. Defaults to public.processed_events.
	Tables outbox.Tables
	// Client says how to reach Kafka; Client.Opts are passed to franz-go
	// after the consumer's own options, so they win (the consumer fetches
	// at most 1 MiB a request to bound its memory: pass kgo.FetchMaxBytes
	// to change that). Brokers are required.
	Client kafka.ClientConfig
	// Topics to consume. Required.
	Topics []string
	// Group is the Kafka consumer group. Defaults to Name.
	Group string
	// Handlers maps an event type (the event_type header) to its handler.
	// Defaults to none; then DefaultHandler handles every type.
	Handlers map[string]Handler
	// DefaultHandler handles types missing from Handlers. Defaults to nil:
	// such records are dead-lettered as malformed. Handlers or
	// DefaultHandler must be set.
	DefaultHandler Handler
	// Middleware wraps every handler, the first outermost. Panics are
	// always recovered (see Recover). Defaults to none.
	Middleware []Middleware
	// MaxAttempts is how many times a failing handler runs for one record
	// before the record is dead-lettered. A handler error wrapped with
	// Permanent is dead-lettered after its first attempt. Database outages,
	// deadlocks and serialisation failures do not count: while the
	// database is unreachable, records wait. Defaults to 5.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential backoff (with
	// jitter) between attempts. Default to 100ms and 5s.
	BackoffMin, BackoffMax time.Duration
	// DeadLetterTopic names the dead-letter topic of a topic. The topic
	// must exist or the broker must create topics on first use. Defaults
	// to topic + ".dlq".
	DeadLetterTopic func(topic string) string
	// BatchSize is how many consecutive records of one partition are
	// processed in one transaction (ProcessBatch). When a handler fails,
	// that batch is rolled back and its records are processed one by one.
	// 1 turns batching off. Defaults to DefaultBatchSize (100).
	BatchSize int
	// MaxPollRecords bounds how many records one poll takes. Rebalances
	// wait while a poll's records are processed, so this bounds how long a
	// rebalance waits. Defaults to 500.
	MaxPollRecords int
	// Concurrency is how many partitions are processed at once, each in
	// its own transactions. Records of one partition are always processed
	// in order. Raise it only when handlers of different partitions touch
	// different rows: two batches that update the same rows in different
	// orders deadlock, and Postgres takes deadlock_timeout (1s by default)
	// to notice. Defaults to DefaultConcurrency (1).
	Concurrency int
	// CommitInterval is how often offsets of done records are committed
	// while the rest of a poll is still being processed; a poll's offsets
	// are also committed when it is done. Defaults to 1s.
	CommitInterval time.Duration
	// ShutdownTimeout bounds how long the transaction in flight may take
	// to finish after Run's context is cancelled; past it, it is rolled
	// back and its records are redelivered later. Defaults to 10s.
	ShutdownTimeout time.Duration
	// SkipSchemaCheck skips the check, when Run starts, that the processed
	// table exists. Defaults to false.
	SkipSchemaCheck bool
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// BeforeCommit, if set, is called with the offsets about to be
	// committed (topic -> partition -> next offset to read), after the
	// transactions that processed those records committed. Returning an
	// error stops the consumer without committing them: Run returns the
	// error. It exists for tests that simulate a crash between the
	// database commit and the offset commit, and for instrumentation.
	// Called from the consumer's goroutines, one call at a time. Defaults
	// to nil.
	BeforeCommit func(offsets map[string]map[int32]int64) error
}

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
	cfg      Config
	proc     *Processor
	log      *slog.Logger
	opts     []kgo.Opt // the group consumer's
	dlqOpts  []kgo.Opt // the dead-letter producer's
	handlers map[string]Handler
	dflt     Handler
	dlq      map[string]string

	started atomic.Bool
	client  *kgo.Client
	dlqCl   *kgo.Client
	hurry   chan struct{}

	mu          sync.Mutex
	uncommitted map[string]map[int32]*kgo.Record // last done record per partition, not yet committed
	crashed     error                            // set when BeforeCommit stopped the consumer

	records, deadLettered, deadLetterDropped, malformed, retries atomic.Int64
}

// New validates cfg and applies its defaults.
func New(cfg Config) (*Consumer, error) {
	proc, err := NewProcessor(ProcessorConfig{Name: cfg.Name, Pool: cfg.Pool, Tables: cfg.Tables})
	if err != nil {
		return nil, err
	}
	cfg.Tables = proc.Config().Tables
	if len(cfg.Topics) == 0 {
		return nil, errors.New("consumer: no Topics; list the topics to consume, e.g. \"order\" for events of type \"order.*\"")
	}
	seen := map[string]bool{}
	for _, t := range cfg.Topics {
		if err := outbox.ValidateTopic(t); err != nil {
			return nil, fmt.Errorf("consumer: Topics holds %s", err)
		}
		if seen[t] {
			return nil, fmt.Errorf("consumer: topic %q is listed twice in Topics", t)
		}
		seen[t] = true
	}
	if cfg.Group == "" {
		cfg.Group = cfg.Name
	}
	if len(cfg.Handlers) == 0 && cfg.DefaultHandler == nil {
		return nil, errors.New("consumer: no handlers; set Handlers (event type -> handler) or DefaultHandler")
	}
	for typ, h := range cfg.Handlers {
		if h == nil {
			return nil, fmt.Errorf("consumer: the handler for event type %q is nil", typ)
		}
	}
	for i, mw := range cfg.Middleware {
		if mw == nil {
			return nil, fmt.Errorf("consumer: Middleware[%d] is nil", i)
		}
	}
	if cfg.DeadLetterTopic == nil {
		cfg.DeadLetterTopic = func(topic string) string { return topic + ".dlq" }
	}
	dlq := map[string]string{}
	for _, t := range cfg.Topics {
		d := cfg.DeadLetterTopic(t)
		if err := outbox.ValidateTopic(d); err != nil {
			return nil, fmt.Errorf("consumer: the dead-letter topic of %q is %s", t, err)
		}
		if seen[d] {
			return nil, fmt.Errorf("consumer: the dead-letter topic of %q is %q, which this consumer also reads; dead letters would come back as input", t, d)
		}
		dlq[t] = d
	}
	if cfg.MaxAttempts < 0 {
		return nil, fmt.Errorf("consumer: MaxAttempts is %d; use a positive number, or 0 for the default 5", cfg.MaxAttempts)
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 5
	}
	for _, f := range []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"BackoffMin", &cfg.BackoffMin, 100 * time.Millisecond},
		{"BackoffMax", &cfg.BackoffMax, 5 * time.Second},
		{"ShutdownTimeout", &cfg.ShutdownTimeout, 10 * time.Second},
		{"CommitInterval", &cfg.CommitInterval, time.Second},
	} {
		if *f.d < 0 {
			return nil, fmt.Errorf("consumer: %s is %s; use a positive duration, or 0 for the default", f.name, *f.d)
		}
		if *f.d == 0 {
			*f.d = f.def
		}
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		return nil, fmt.Errorf("consumer: BackoffMax (%s) is below BackoffMin (%s)", cfg.BackoffMax, cfg.BackoffMin)
	}
	for _, f := range []struct {
		name     string
		n        *int
		def, max int
	}{
		{"BatchSize", &cfg.BatchSize, DefaultBatchSize, 10_000},
		{"MaxPollRecords", &cfg.MaxPollRecords, 500, 100_000},
		{"Concurrency", &cfg.Concurrency, DefaultConcurrency, 1024},
	} {
		if *f.n < 0 || *f.n > f.max {
			return nil, fmt.Errorf("consumer: %s is %d; use 1 to %d, or 0 for the default %d", f.name, *f.n, f.max, f.def)
		}
		if *f.n == 0 {
			*f.n = f.def
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}

	c := &Consumer{
		cfg:         cfg,
		proc:        proc,
		log:         cfg.Logger.With("consumer", cfg.Name),
		handlers:    make(map[string]Handler, len(cfg.Handlers)),
		dlq:         dlq,
		hurry:       make(chan struct{}, 1),
		uncommitted: map[string]map[int32]*kgo.Record{},
	}
	for typ, h := range cfg.Handlers {
		c.handlers[typ] = Chain(h, cfg.Middleware...)
	}
	if cfg.DefaultHandler != nil {
		c.dflt = Chain(cfg.DefaultHandler, cfg.Middleware...)
	}

	base, err := cfg.Client.Options()
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	c.opts = append([]kgo.Opt{
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		// A new group reads from the start, so no event is missed.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// franz-go's default (50 MiB a fetch) let a consumer working
		// through a million-record backlog peak at 130 MiB; at 1 MiB it
		// peaked at 43 MiB and ran no slower (`outbox bench memory`). A
		// record batch larger than this is still returned whole.
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
	}, base...)
	// Dead letters go through a client of their own: a produce error makes
	// a client refresh its metadata, which a consumer client holding a
	// poll (BlockRebalanceOnPoll) can make wait.
	c.dlqOpts = append(kafka.ProducerOptions(), base...)
	return c, nil
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
		Retries:           c.retries.Load(),
	}
}

// Processor returns the processing core the consumer runs on, for
// processing events that arrive some other way under the same name.
func (c *Consumer) Processor() *Processor { return c.proc }

// Run consumes until ctx is cancelled, then lets the transaction in flight
// finish (within ShutdownTimeout), commits the offsets of what is done,
// leaves the group and returns nil. It returns an error only when it cannot
// start (the database is unreachable, or the processed table missing), when
// it is called twice, or when BeforeCommit stops it. Bad records never stop it: they are
// dead-lettered. Database and broker outages are waited out.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("consumer: Run was already called; create a new Consumer to run again")
	}
	if !c.cfg.SkipSchemaCheck {
		if err := c.proc.Check(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	dlqCl, err := kgo.NewClient(c.dlqOpts...)
	if err != nil {
		return fmt.Errorf("consumer: kafka client: %w", err)
	}
	defer dlqCl.Close()
	c.dlqCl = dlqCl
	cl, err := kgo.NewClient(c.opts...)
	if err != nil {
		return fmt.Errorf("consumer: kafka client: %w", err)
	}
	c.client = cl

	// The transaction in flight must not die with ctx: it finishes, then
	// Run returns. Only ShutdownTimeout after cancellation is it cut short.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.cfg.ShutdownTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stopAfter()

	c.log.Info("consumer started", "group", c.cfg.Group, "topics", c.cfg.Topics, "batch_size", c.cfg.BatchSize, "max_attempts", c.cfg.MaxAttempts)
	var runErr error
	for ctx.Err() == nil {
		select { // a signal from the previous poll is stale
		case <-c.hurry:
		default:
		}
		fetches := cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		errored := false
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			errored = true
			c.log.Warn("kafka fetch failed; retrying", "topic", topic, "partition", partition, "err", err)
		})
		if fetches.NumRecords() == 0 {
			cl.AllowRebalance()
			if errored && !backoff.Sleep(ctx, c.cfg.BackoffMin) {
				break
			}
			continue
		}
		if runErr = c.poll(ctx, work, fetches); runErr != nil {
			break
		}
		cl.AllowRebalance()
	}

	// Leaving the group runs onRevoked, which commits any offsets a failed
	// commit left behind. Bound the leave: a dead broker must not hold
	// shutdown forever.
	cl.AllowRebalance()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	if err := cl.LeaveGroupContext(lctx); err != nil && runErr == nil {
		c.log.Warn("leaving the consumer group failed; its partitions move after the session timeout", "err", err)
	}
	cancel()
	cl.Close()
	if runErr != nil {
		c.log.Error("consumer stopped", "err", runErr)
		return runErr
	}
	c.log.Info("consumer stopped")
	return nil
}

// item is one record of a poll, decoded.
type item struct {
	rec *kgo.Record
	ev  Event
	bad *malformed
}

// poll processes one poll's records, commits the offsets of what is done,
// and rewinds partitions whose records were abandoned so they are polled
// again. It returns an error only when BeforeCommit stopped the consumer.
func (c *Consumer) poll(ctx, work context.Context, fetches kgo.Fetches) error {
	// stop ends processing early: on shutdown, or when a rebalance waits.
	stop, cancelStop := context.WithCancel(ctx)
	defer cancelStop()
	go func() {
		select {
		case <-c.hurry:
			c.log.Info("rebalance waiting; yielding after the transaction in flight")
			cancelStop()
		case <-stop.Done():
		}
	}()

	var parts [][]item
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		items := make([]item, len(p.Records))
		for i, r := range p.Records {
			items[i] = c.decode(r)
		}
		c.records.Add(int64(len(items)))
		parts = append(parts, items)
	})

	// Commit what is done while the rest of the poll is processed, so a
	// slow or stuck record does not hold back the other partitions'
	// commits.
	committerDone := make(chan struct{})
	go func() {
		defer close(committerDone)
		tick := time.NewTicker(c.cfg.CommitInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop.Done():
				return
			case <-tick.C:
				if err := c.commit(c.client, nil); err != nil {
					cancelStop() // BeforeCommit stopped us: stop processing
					return
				}
			}
		}
	}()

	done := make([]int, len(parts))
	sem := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, items := range parts {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			done[i] = c.partition(stop, work, items)
		})
	}
	wg.Wait()
	cancelStop()
	<-committerDone

	rewind := map[string]map[int32]kgo.EpochOffset{}
	for i, items := range parts {
		if n := done[i]; n < len(items) {
			r := items[n].rec
			if rewind[r.Topic] == nil {
				rewind[r.Topic] = map[int32]kgo.EpochOffset{}
			}
			rewind[r.Topic][r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
		}
	}
	if err := c.commit(c.client, nil); err != nil {
		return err
	}
	if len(rewind) > 0 && ctx.Err() == nil {
		// The client's fetch position is past the abandoned records; move it
		// back so they come again (after the rebalance, to whichever member
		// then owns the partition: a revoked partition starts from the
		// committed offset anyway).
		c.client.SetOffsets(rewind)
	}
	return nil
}

// markDone records that r and every record before it in its partition are
// done, so the next commit moves the partition's offset past r.
func (c *Consumer) markDone(r *kgo.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := c.uncommitted[r.Topic]
	if ps == nil {
		ps = map[int32]*kgo.Record{}
		c.uncommitted[r.Topic] = ps
	}
	ps[r.Partition] = r
}

// partition processes one partition's records in order and returns how
// many leading records are done: processed, duplicates or dead-lettered.
// The rest were abandoned because stop was cancelled.
func (c *Consumer) partition(stop, work context.Context, items []item) int {
	i := 0
	for i < len(items) && stop.Err() == nil {
		if items[i].bad != nil {
			if !c.deadLetter(stop, work, items[i].rec, 0, items[i].bad.Error()) {
				return i
			}
			c.malformed.Add(1)
			c.markDone(items[i].rec)
			i++
			continue
		}
		j := i
		for j < len(items) && j-i < c.cfg.BatchSize && items[j].bad == nil {
			j++
		}
		run := items[i:j]
		var failed *HandlerError
		if len(run) > 1 {
			evs := make([]Event, len(run))
			for k, it := range run {
				evs[k] = it.ev
			}
			_, err := c.proc.ProcessBatch(work, evs, c.dispatch)
			if err == nil {
				c.markDone(run[len(run)-1].rec)
				i = j
				continue
			}
			// One failed (or the database did): one by one, so the rest
			// commit and the failing one is retried or dead-lettered alone.
			// Its failure in the batch counts as its first attempt.
			if !errors.As(err, &failed) {
				failed = nil
			}
		}
		for k, it := range run {
			var prior *HandlerError
			if failed != nil && failed.Index == k {
				prior = failed
			}
			if !c.processOne(stop, work, it, prior) {
				return i
			}
			c.markDone(it.rec)
			i++
		}
	}
	return i
}

// processOne processes one record with retries, dead-lettering it when its
// handler keeps failing, or at once when the processed table refuses its
// data (see classify). prior, when set, is the record's failure in a
// batch: its first attempt. It returns false if it gave up because stop was
// cancelled; the record is then not done.
func (c *Consumer) processOne(stop, work context.Context, it item, prior *HandlerError) bool {
	attempts, outages := 0, 0
	var err error
	if prior != nil {
		err = prior
	}
	for stop.Err() == nil {
		if err == nil {
			if _, err = c.proc.Process(work, it.ev, c.dispatch); err == nil {
				return true
			}
		}
		if work.Err() != nil {
			return false
		}
		blame := classify(err)
		if blame == theRecord {
			c.log.Error("the processed table refuses the event; dead-lettering the record", "topic", it.rec.Topic, "partition", it.rec.Partition,
				"offset", it.rec.Offset, "event_id", it.ev.ID, "err", err)
			return c.deadLetter(stop, work, it.rec, attempts, err.Error())
		}
		if blame == notTheEvent || c.pool().Ping(work) != nil {
			// The database failed, not the handler (or the handler failed
			// because the database is gone, or lost a deadlock or
			// serialisation conflict with another transaction): nothing is
			// wrong with the event, so wait and retry without counting an
			// attempt.
			outages++
			c.retries.Add(1)
			d := backoff.Delay(c.cfg.BackoffMin, c.cfg.BackoffMax, outages)
			c.log.Warn("processing failed, not for the event's fault; retrying", "err", err, "event_id", it.ev.ID, "retry_in", d.Round(time.Millisecond))
			if !backoff.Sleep(stop, d) {
				return false
			}
			err = nil
			continue
		}
		var he *HandlerError
		if !errors.As(err, &he) { // the commit refused the handler's writes
			he = &HandlerError{Source: it.ev.Source, EventID: it.ev.ID, Err: err}
		}
		attempts++
		log := c.log.With("topic", it.rec.Topic, "partition", it.rec.Partition, "offset", it.rec.Offset,
			"event_id", it.ev.ID, "event_type", it.ev.Type, "attempt", attempts)
		if IsPermanent(err) || attempts >= c.cfg.MaxAttempts {
			var pe *PanicError
			if errors.As(err, &pe) {
				log = log.With("stack", string(pe.Stack))
			}
			log.Error("handler failed; dead-lettering the record", "err", he.Err)
			return c.deadLetter(stop, work, it.rec, attempts, he.Err.Error())
		}
		c.retries.Add(1)
		d := backoff.Delay(c.cfg.BackoffMin, c.cfg.BackoffMax, attempts)
		log.Warn("handler failed; retrying", "err", he.Err, "retry_in", d.Round(time.Millisecond))
		if !backoff.Sleep(stop, d) {
			return false
		}
		err = nil
	}
	return false
}

func (c *Consumer) pool() *pgxpool.Pool { return c.cfg.Pool }

// dispatch routes an event to its handler. decode has made sure one exists.
func (c *Consumer) dispatch(ctx context.Context, tx pgx.Tx, ev Event) error {
	if h, ok := c.handlers[ev.Type]; ok {
		return h(ctx, tx, ev)
	}
	return c.dflt(ctx, tx, ev)
}

func (c *Consumer) decode(r *kgo.Record) item {
	ev, bad := decode(r)
	if bad == nil {
		if _, ok := c.handlers[ev.Type]; !ok && c.dflt == nil {
			bad = &malformed{fmt.Sprintf("no handler for event type %q and no default handler", ev.Type)}
		}
	}
	return item{rec: r, ev: ev, bad: bad}
}

// leaveTimeout bounds leaving the group at shutdown (with the final offset
// commit it triggers).
const leaveTimeout = 15 * time.Second

// dlqWriteTimeout bounds one dead-letter write, in case the broker neither
// acknowledges nor refuses it.
const dlqWriteTimeout = 30 * time.Second

// commit commits the done offsets of the given partitions (all when
// partitions is nil). A failed commit is logged and kept for the next
// commit: its records may be redelivered, and are then duplicates.
func (c *Consumer) commit(cl *kgo.Client, partitions map[string][]int32) error {
	c.mu.Lock()
	if c.crashed != nil {
		c.mu.Unlock()
		return c.crashed
	}
	var recs []*kgo.Record
	offsets := map[string]map[int32]int64{}
	for topic, ps := range c.uncommitted {
		for p, r := range ps {
			if partitions != nil && !slices.Contains(partitions[topic], p) {
				continue
			}
			recs = append(recs, r)
			if offsets[topic] == nil {
				offsets[topic] = map[int32]int64{}
			}
			offsets[topic][p] = r.Offset + 1
		}
	}
	if len(recs) == 0 {
		c.mu.Unlock()
		return nil
	}
	if c.cfg.BeforeCommit != nil {
		if err := c.cfg.BeforeCommit(offsets); err != nil {
			c.crashed = fmt.Errorf("consumer: BeforeCommit stopped the consumer before it committed offsets %s: %w", formatOffsets(offsets), err)
			c.mu.Unlock()
			return c.crashed
		}
	}
	c.mu.Unlock()

	// Not under mu: the commit waits for a join in progress, and the
	// group's callbacks take mu.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.CommitRecords(ctx, recs...); err != nil {
		c.log.Warn("offset commit failed; will retry (records past the last commit may be redelivered, and are then skipped as duplicates)",
			"offsets", formatOffsets(offsets), "err", err)
		return nil
	}
	c.mu.Lock()
	for _, r := range recs {
		if c.uncommitted[r.Topic][r.Partition] == r { // not moved on meanwhile
			delete(c.uncommitted[r.Topic], r.Partition)
		}
	}
	c.mu.Unlock()
	return nil
}

func (c *Consumer) onBlocked(context.Context, *kgo.Client) {
	select {
	case c.hurry <- struct{}{}:
	default:
	}
}

// onRevoked commits what is done on the revoked partitions (normally
// nothing: every poll commits before it lets a rebalance run) and forgets
// them.
func (c *Consumer) onRevoked(_ context.Context, cl *kgo.Client, revoked map[string][]int32) {
	_ = c.commit(cl, revoked) // fails only after BeforeCommit stopped us
	c.forget(revoked)
}

// onLost forgets lost partitions: another member owns them now, and a
// commit would fail (or rewind its progress).
func (c *Consumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.forget(lost)
}

func (c *Consumer) forget(partitions map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, ps := range partitions {
		for _, p := range ps {
			delete(c.uncommitted[topic], p)
		}
	}
}

func formatOffsets(offsets map[string]map[int32]int64) string {
	var parts []string
	for topic, ps := range offsets {
		for p, o := range ps {
			parts = append(parts, topic+"/"+strconv.Itoa(int(p))+"@"+strconv.FormatInt(o, 10))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
