// Package relay moves committed outbox rows to a broker: it claims pending
// rows with FOR UPDATE SKIP LOCKED, publishes them, and marks dispatched
// only what the broker acknowledged, in the same transaction. Any number of
// relayers can run against one table; events of one aggregate still reach
// the broker in commit order. Delivery is at-least-once.
//
//	pub := kafka.NewPublisher(client, kafka.PublisherConfig{})
//	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub})
//	err = r.Run(ctx) // until ctx is cancelled
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/migrate"
)

// Defaults of Config.
const (
	DefaultBatchSize     = 5000
	DefaultMaxBatchBytes = 4 << 20
)

// Config configures a Relayer. Pool and Publisher are required.
type Config struct {
	// Pool connects to the database holding the outbox. Required.
	Pool *pgxpool.Pool
	// Publisher delivers batches to the broker. Required.
	Publisher Publisher
	// Tables names the outbox table. Defaults to public.events_outbox.
	Tables outbox.Tables
	// TopicPrefix is prepended to the topic derived from each event type.
	// It must match the producers'. Defaults to "".
	TopicPrefix string
	// BatchSize is the most rows one claim takes. Larger batches spread
	// each claim's fixed costs (the walks over the pending index, the
	// commit's flush, the broker round trip) over more rows: one relayer
	// drained 92k events/s with 5,000 against 67k with 1,000
	// (BENCHMARKS.md); MaxBatchBytes keeps large payloads from multiplying
	// the memory this takes. Defaults to 5000.
	BatchSize int
	// MaxBatchBytes bounds the payload bytes of one batch, which the relayer
	// holds in memory (twice, with pipelining), so large payloads cannot
	// multiply its footprint: a claim stops before the row that would cross
	// it (a single larger row still goes alone). Sizes are as stored, after
	// Postgres' compression of large values. Defaults to 4 MiB.
	MaxBatchBytes int
	// PollInterval is how long an idle relayer waits for new rows when no
	// notification arrives. Defaults to 1s.
	PollInterval time.Duration
	// BusyPollInterval is how soon the relayer claims again after a batch
	// that found rows, instead of waiting for a notification; each claim
	// that then finds nothing doubles the wait, up to PollInterval.
	// Producers notify at most once per outbox.Config.NotifyInterval, so
	// this is what picks up the events committed between two
	// notifications; it also keeps a poll-only relayer's latency low while
	// events flow. A negative value turns it off. Defaults to 2ms.
	BusyPollInterval time.Duration
	// PollOnly disables LISTEN/NOTIFY, for connection poolers in transaction
	// mode (PgBouncer, Supavisor), which cannot hold a LISTEN. Defaults to
	// false.
	PollOnly bool
	// MaxPayloadBytes: rows whose payload is larger are not sent (the broker
	// would refuse them) and count as permanent failures. Defaults to
	// outbox.DefaultMaxPayloadBytes.
	MaxPayloadBytes int
	// HoldOut is how long an aggregate whose oldest pending row failed
	// permanently is left out of claims before the row is tried again.
	// Later rows of that aggregate wait too: order is kept. Defaults to 1m.
	HoldOut time.Duration
	// BackoffMin and BackoffMax bound the exponential backoff (with jitter)
	// after a failed batch: broker or database unreachable. Default to
	// 100ms and 30s.
	BackoffMin, BackoffMax time.Duration
	// ShutdownTimeout bounds how long Run lets the in-flight batch finish
	// after its context is cancelled; past it the batch is abandoned and
	// rolled back. Defaults to 30s.
	ShutdownTimeout time.Duration
	// DisablePipelining makes the relayer claim its next batch only after
	// the previous one committed. By default, while a full batch is being
	// published, the next one is claimed on a second connection (so Pool
	// needs two), and it is published only once the first was acknowledged
	// and committed in full; otherwise it is rolled back unpublished.
	// Defaults to false.
	DisablePipelining bool
	// SkipSchemaCheck skips the check, when Run starts, that the table's
	// schema is at the version this binary expects. Defaults to false.
	SkipSchemaCheck bool
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// OnBatch, if set, is called after every batch that claimed rows, one
	// batch at a time, in order. Keep it fast.
	OnBatch func(BatchResult)
}

// BatchResult describes one claim-publish-mark cycle.
type BatchResult struct {
	// Locked is how many pending rows the claim locked; Claimed of them were
	// the oldest pending rows of their aggregates and were published. The
	// rest waited behind a row another relayer holds.
	Locked, Claimed int
	// Dispatched rows the broker acknowledged and were marked.
	Dispatched int
	// Permanent failures (held out), Transient failures (retried).
	Permanent, Transient int
	// Deferred rows that followed a failed row of their aggregate: left
	// pending so order is kept.
	Deferred int
	// Duration from claim to commit.
	Duration time.Duration
	// Latencies holds, per dispatched row, the time from its commit into the
	// outbox (created_at) to the broker's acknowledgement.
	Latencies []time.Duration
}

// Stats are cumulative counters since the relayer was created.
type Stats struct {
	Batches, Claimed, Dispatched, PermanentFailures, TransientFailures, FailedBatches int64
}

// Failure is the last permanent failure of a held-out aggregate.
type Failure struct {
	EventID     int64
	AggregateID uuid.UUID
	Type        string
	Err         string
	At          time.Time
	Until       time.Time
}

// Relayer runs the claim-publish-mark loop. Create it with New, run it
// with Run.
type Relayer struct {
	cfg       Config
	log       *slog.Logger
	claimSQL  string
	unmarkSQL string
	wake      chan struct{}

	mu   sync.Mutex
	held map[uuid.UUID]Failure

	batches, claimed, dispatched, permanent, transient, failedBatches atomic.Int64
}

// New validates cfg and applies its defaults.
func New(cfg Config) (*Relayer, error) {
	if cfg.Pool == nil {
		return nil, errors.New("relay: Config.Pool is nil; pass a *pgxpool.Pool connected to the outbox database")
	}
	if cfg.Publisher == nil {
		return nil, errors.New("relay: Config.Publisher is nil; pass a publisher, e.g. kafka.NewPublisher")
	}
	if err := cfg.Tables.Validate(); err != nil {
		return nil, err
	}
	cfg.Tables = cfg.Tables.WithDefaults()
	if cfg.TopicPrefix != "" {
		if err := outbox.ValidateTopic(cfg.TopicPrefix + "x"); err != nil {
			return nil, fmt.Errorf("relay: topic prefix %q cannot start a topic name: %s", cfg.TopicPrefix, err)
		}
	}
	type dflt struct {
		name string
		d    *time.Duration
		def  time.Duration
	}
	switch {
	case cfg.BusyPollInterval == 0:
		cfg.BusyPollInterval = 2 * time.Millisecond
	case cfg.BusyPollInterval < 0:
		cfg.BusyPollInterval = -1 // off
	}
	for _, f := range []dflt{
		{"PollInterval", &cfg.PollInterval, time.Second},
		{"HoldOut", &cfg.HoldOut, time.Minute},
		{"BackoffMin", &cfg.BackoffMin, 100 * time.Millisecond},
		{"BackoffMax", &cfg.BackoffMax, 30 * time.Second},
		{"ShutdownTimeout", &cfg.ShutdownTimeout, 30 * time.Second},
	} {
		if *f.d < 0 {
			return nil, fmt.Errorf("relay: %s is %s; use a positive duration, or 0 for the default", f.name, *f.d)
		}
		if *f.d == 0 {
			*f.d = f.def
		}
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		return nil, fmt.Errorf("relay: BackoffMax (%s) is below BackoffMin (%s); raise BackoffMax or lower BackoffMin", cfg.BackoffMax, cfg.BackoffMin)
	}
	if cfg.BatchSize < 0 || cfg.BatchSize > 100_000 {
		return nil, fmt.Errorf("relay: BatchSize is %d; use 1 to 100000, or 0 for the default 5000", cfg.BatchSize)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.MaxBatchBytes < 0 {
		return nil, fmt.Errorf("relay: MaxBatchBytes is %d; use a positive limit, or 0 for the default 4 MiB", cfg.MaxBatchBytes)
	}
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if cfg.MaxPayloadBytes < 0 {
		return nil, fmt.Errorf("relay: MaxPayloadBytes is %d; use a positive limit, or 0 for the default", cfg.MaxPayloadBytes)
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = outbox.DefaultMaxPayloadBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	table := cfg.Tables.OutboxIdent()
	return &Relayer{
		cfg:       cfg,
		log:       cfg.Logger.With("outbox", table),
		claimSQL:  render(claimSQL, table),
		unmarkSQL: render(unmarkSQL, table),
		wake:      make(chan struct{}, 1),
		held:      map[uuid.UUID]Failure{},
	}, nil
}

// Config returns the configuration with defaults applied.
func (r *Relayer) Config() Config { return r.cfg }

// Stats returns the cumulative counters.
func (r *Relayer) Stats() Stats {
	return Stats{
		Batches: r.batches.Load(), Claimed: r.claimed.Load(), Dispatched: r.dispatched.Load(),
		PermanentFailures: r.permanent.Load(), TransientFailures: r.transient.Load(), FailedBatches: r.failedBatches.Load(),
	}
}

// Held returns the aggregates currently held out after a permanent failure.
func (r *Relayer) Held() []Failure {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	var out []Failure
	for _, f := range r.held {
		if f.Until.After(now) {
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b Failure) int { return int(a.EventID - b.EventID) })
	return out
}

// Run relays until ctx is cancelled, then lets the batch in flight finish
// (within ShutdownTimeout) and returns nil. It returns an error only when
// it cannot start: the schema is missing or out of date, or the database is
// unreachable at start. Once running it rides out database and broker
// outages with backoff.
func (r *Relayer) Run(ctx context.Context) error {
	if !r.cfg.SkipSchemaCheck {
		m, err := migrate.New(r.cfg.Tables)
		if err != nil {
			return err
		}
		if err := m.Validate(ctx, r.cfg.Pool); err != nil {
			return fmt.Errorf("relay: %w", err)
		}
	}
	// The batch in flight must not die with ctx: it finishes, then Run
	// returns. Only ShutdownTimeout after cancellation is it cut short.
	batchCtx, cancelBatch := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBatch()
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.ShutdownTimeout, cancelBatch)
		context.AfterFunc(batchCtx, func() { t.Stop() })
	})
	defer stopAfter()

	var wg sync.WaitGroup
	if !r.cfg.PollOnly {
		wg.Go(func() { r.listen(ctx) })
	}
	defer wg.Wait()

	r.log.Info("relay started", "batch_size", r.cfg.BatchSize, "poll_interval", r.cfg.PollInterval, "busy_poll_interval", r.cfg.BusyPollInterval, "poll_only", r.cfg.PollOnly)
	defer r.log.Info("relay stopped")
	// next is a batch claimed while the previous one was being published.
	var next *claimed
	defer func() {
		if next != nil {
			next.abandon(batchCtx)
		}
	}()
	failures := 0
	// busy is the wait before the next follow-up claim after rows were
	// found (BusyPollInterval, doubling while claims find nothing); 0 when
	// idle.
	var busy time.Duration
	// futile counts claims in a row whose every row waited behind another
	// relayer; while it is not 0, claims are probes of probeSize rows.
	futile := 0
	for ctx.Err() == nil {
		cur := next
		next = nil
		var err error
		if cur == nil {
			size := r.cfg.BatchSize
			if futile > 0 {
				size = min(size, probeSize)
			}
			cur, err = r.claimBatch(batchCtx, size, nil)
		}
		var res BatchResult
		full := false
		if err == nil {
			full = cur.locked >= cur.size
			res, next, err = r.relay(ctx, batchCtx, cur)
		}
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, context.Canceled) {
				return nil
			}
			failures++
			r.failedBatches.Add(1)
			d := backoff.Delay(r.cfg.BackoffMin, r.cfg.BackoffMax, failures)
			r.log.Warn("relay batch failed; backing off", "err", err, "attempt", failures, "retry_in", d.Round(time.Millisecond))
			if !backoff.Sleep(ctx, d) {
				return nil
			}
			continue
		}
		failures = 0
		switch {
		case res.Claimed > 0:
			busy, futile = r.cfg.BusyPollInterval, 0
		case busy > 0:
			busy *= 2
		}
		switch {
		case next != nil, full && res.Claimed > 0:
			continue // more waiting: loop at once
		case res.Locked > 0 && res.Claimed == 0:
			// Everything we could lock waits behind rows another relayer
			// is publishing. Such a claim is not only futile: while it
			// holds its candidates, the other relayer's next claim must
			// skip them and then finds its own aggregates gapped. So back
			// off (5 ms, doubling to 100 ms) and probe with small claims
			// until one finds rows of its own again.
			futile++
			if !backoff.Sleep(ctx, backoff.Delay(5*time.Millisecond, 100*time.Millisecond, futile)) {
				return nil
			}
			continue
		}
		wait := r.cfg.PollInterval
		if busy > 0 && busy < wait {
			wait = busy
		} else {
			busy = 0
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-r.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
	return nil
}

// claimed is a batch claimed and marked in its still open transaction.
type claimed struct {
	tx           pgx.Tx
	msgs         []Message
	size, locked int // rows asked for, rows locked
	start        time.Time
}

// abandon rolls the batch back: its rows return to pending, unpublished.
func (c *claimed) abandon(ctx context.Context) {
	c.tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the rows stay pending either way
}

// claimBatch opens a transaction and claims a batch in it. ahead are the
// rows of the batch this relayer is still publishing, which this one
// follows.
func (r *Relayer) claimBatch(ctx context.Context, size int, ahead []int64) (*claimed, error) {
	start := time.Now()
	tx, err := r.cfg.Pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: claimBegin})
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	msgs, locked, err := r.claim(ctx, tx, size, ahead)
	if err != nil {
		tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // reporting the claim's error
		return nil, err
	}
	return &claimed{tx: tx, msgs: msgs, size: size, locked: locked, start: start}, nil
}

// relay publishes and commits cur. When cur is a full batch, so more rows
// are waiting, it claims the next batch meanwhile and returns it, unless
// cur did not go through in full: the next batch may hold later rows of an
// aggregate whose row in cur failed, so it is rolled back unpublished. It
// is not claimed once ctx (Run's) is cancelled.
func (r *Relayer) relay(ctx, batchCtx context.Context, cur *claimed) (BatchResult, *claimed, error) {
	if r.cfg.DisablePipelining || len(cur.msgs) == 0 || cur.locked < cur.size || ctx.Err() != nil {
		res, err := r.finish(batchCtx, cur)
		return res, nil, err
	}
	type outcome struct {
		res BatchResult
		err error
	}
	ahead := make([]int64, len(cur.msgs))
	for i, m := range cur.msgs {
		ahead[i] = m.ID
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := r.finish(batchCtx, cur)
		done <- outcome{res, err}
	}()
	next, nerr := r.claimBatch(batchCtx, r.cfg.BatchSize, ahead)
	out := <-done
	if out.err != nil || out.res.Dispatched != out.res.Claimed {
		if next != nil {
			next.abandon(batchCtx)
		}
		return out.res, nil, out.err
	}
	if nerr != nil {
		return out.res, nil, nerr
	}
	return out.res, next, nil
}

// finish publishes a claimed batch, returns the rows the broker did not
// acknowledge to pending and commits.
func (r *Relayer) finish(ctx context.Context, c *claimed) (BatchResult, error) {
	tx, msgs := c.tx, c.msgs
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	res := BatchResult{Locked: c.locked, Claimed: len(msgs)}
	if len(msgs) == 0 {
		return res, tx.Commit(ctx)
	}

	// Rows that cannot be published are failed before sending; the rows of
	// their aggregate after them are not sent either, so nothing overtakes.
	errs := make([]error, len(msgs))
	blocked := map[uuid.UUID]bool{}
	send := make([]Message, 0, len(msgs))
	sendIdx := make([]int, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if blocked[m.AggregateID] {
			errs[i] = errDeferred
			continue
		}
		topic, err := outbox.Topic(r.cfg.TopicPrefix, m.Type)
		if err == nil && len(m.Payload) > r.cfg.MaxPayloadBytes {
			err = fmt.Errorf("payload is %d bytes; the limit is %d (raise the relay's max payload and the broker's message.max.bytes, or delete the row)", len(m.Payload), r.cfg.MaxPayloadBytes)
		}
		if err != nil {
			errs[i] = Permanent(err)
			blocked[m.AggregateID] = true
			continue
		}
		m.Topic = topic
		send = append(send, *m)
		sendIdx = append(sendIdx, i)
	}
	if len(send) > 0 {
		perr := r.cfg.Publisher.Publish(ctx, send)
		if len(perr) != len(send) {
			return res, fmt.Errorf("publisher returned %d results for %d messages", len(perr), len(send))
		}
		for j, i := range sendIdx {
			errs[i] = perr[j]
		}
	}
	ackedAt := time.Now()

	// Per aggregate, mark the acknowledged prefix only: a row acknowledged
	// after a failed row of its aggregate stays pending and is sent again
	// after it (at-least-once), rather than being marked out of order.
	failed := map[uuid.UUID]bool{}
	var unmark []int64
	var firstTransient error
	for i, m := range msgs {
		err := errs[i]
		if err == nil && !failed[m.AggregateID] {
			res.Dispatched++
			res.Latencies = append(res.Latencies, ackedAt.Sub(m.CreatedAt))
			continue
		}
		unmark = append(unmark, m.ID)
		switch {
		case err == nil, errors.Is(err, errDeferred):
			res.Deferred++
		case IsPermanent(err):
			res.Permanent++
			r.hold(m, err, failed[m.AggregateID])
		default:
			res.Transient++
			if firstTransient == nil {
				firstTransient = err
			}
		}
		failed[m.AggregateID] = true
	}
	if len(unmark) > 0 {
		if _, err := tx.Exec(ctx, r.unmarkSQL, unmark); err != nil {
			return res, fmt.Errorf("return %d unacknowledged rows to pending: %w", len(unmark), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// The broker has the rows but they stay pending: they will be
		// published again. At-least-once.
		return res, fmt.Errorf("commit after publishing %d rows (they will be sent again): %w", res.Dispatched, err)
	}
	res.Duration = time.Since(c.start)
	r.batches.Add(1)
	r.claimed.Add(int64(res.Claimed))
	r.dispatched.Add(int64(res.Dispatched))
	r.permanent.Add(int64(res.Permanent))
	r.transient.Add(int64(res.Transient))
	if r.cfg.OnBatch != nil {
		r.cfg.OnBatch(res)
	}
	if firstTransient != nil {
		return res, fmt.Errorf("publish: %d of %d rows not acknowledged: %w", res.Transient, len(msgs), firstTransient)
	}
	return res, nil
}

// probeSize is the claim of a relayer whose last claims all waited behind
// another relayer: small, so it holds few rows the other needs.
const probeSize = 100

var errDeferred = errors.New("deferred behind an earlier failed row of its aggregate")

func (r *Relayer) claim(ctx context.Context, tx pgx.Tx, size int, ahead []int64) ([]Message, int, error) {
	if ahead == nil {
		ahead = []int64{}
	}
	rows, err := tx.Query(ctx, r.claimSQL, size, r.heldIDs(), ahead, r.cfg.MaxBatchBytes)
	if err != nil {
		return nil, 0, fmt.Errorf("claim: %w", err)
	}
	defer rows.Close()
	msgs := make([]Message, 0, size)
	var locked int64
	for rows.Next() {
		// Nullable: the one row that only carries the count has NULLs.
		var (
			m       Message
			id      *int64
			typ     *string
			created *time.Time
		)
		if err := rows.Scan(&id, &m.AggregateID, &typ, &m.Payload, &m.Headers, &created, &locked); err != nil {
			return nil, 0, fmt.Errorf("claim: scan: %w", err)
		}
		if id == nil {
			continue
		}
		m.ID, m.Type, m.CreatedAt = *id, *typ, *created
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("claim: %w", err)
	}
	slices.SortFunc(msgs, func(a, b Message) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return msgs, int(locked), nil
}

func (r *Relayer) hold(m Message, err error, already bool) {
	now := time.Now()
	f := Failure{EventID: m.ID, AggregateID: m.AggregateID, Type: m.Type, Err: err.Error(), At: now, Until: now.Add(r.cfg.HoldOut)}
	r.mu.Lock()
	r.held[m.AggregateID] = f
	r.mu.Unlock()
	if !already {
		r.log.Error("event rejected for good; holding its aggregate out of claims",
			"event_id", m.ID, "aggregate_id", m.AggregateID, "type", m.Type, "err", err, "retry_in", r.cfg.HoldOut)
	}
}

func (r *Relayer) heldIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	ids := []string{}
	for agg, f := range r.held {
		if f.Until.After(now) {
			ids = append(ids, agg.String())
		} else {
			delete(r.held, agg)
		}
	}
	return ids
}

// listen holds a LISTEN connection and turns notifications into wake-ups,
// reconnecting with backoff. While it is down the relayer still polls.
func (r *Relayer) listen(ctx context.Context) {
	channel := r.cfg.Tables.Channel()
	failures := 0
	for ctx.Err() == nil {
		err := func() error {
			conn, err := pgx.ConnectConfig(ctx, r.cfg.Pool.Config().ConnConfig.Copy())
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if _, err := conn.Exec(ctx, "LISTEN "+pgident.Quote(channel)); err != nil {
				return err
			}
			failures = 0
			r.notify() // rows may have come while we were not listening
			for {
				if _, err := conn.WaitForNotification(ctx); err != nil {
					return err
				}
				r.notify()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		failures++
		d := backoff.Delay(r.cfg.BackoffMin, r.cfg.BackoffMax, failures)
		r.log.Warn("relay listener lost its connection; polling until it is back", "err", err, "retry_in", d.Round(time.Millisecond))
		if !backoff.Sleep(ctx, d) {
			return
		}
	}
}

func (r *Relayer) notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
