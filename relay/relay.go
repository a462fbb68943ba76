// Package relay moves committed outbox rows to a broker: it claims pending
// rows with FOR UPDATE SKIP LOCKED, publishes them, and marks dispatched
// only what the broker acknowledged, in the same transaction. Any number of
// relayers can run against one table; events of one aggregate still reach
// the broker in commit order. Delivery is at-least-once. The Kafka
// publisher is package relay/kafkapub.
//
//	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{"localhost:9092"}})
//	pub := kafkapub.NewPublisher(client, kafkapub.PublisherConfig{})
//	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: pub}})
//	err = r.Run(ctx) // until ctx is cancelled
package relay

import (
	"cmp"
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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay/internal/rowheaders"
)

// Defaults of Config's polling fields, applied by New and used by `outbox
// relay`'s flags; those of the shared fields are Common's.
const (
	DefaultPollInterval     = time.Second
	DefaultBusyPollInterval = 2 * time.Millisecond
	DefaultHoldOut          = time.Minute
	DefaultMaxHoldOut       = 30 * time.Minute
	DefaultLaneLease        = 10 * time.Second
)

// Config configures a Relayer: the fields every source shares (Common;
// Pool and Sink are required) and the polling relay's own.
type Config struct {
	Common

	// PollInterval is how long an idle relayer waits for new rows when no
	// notification arrives. Defaults to DefaultPollInterval (1s).
	PollInterval time.Duration
	// BusyPollInterval is how soon the relayer claims again after a batch
	// that found rows, instead of waiting for a notification; each claim
	// that then finds nothing doubles the wait, up to PollInterval.
	// Producers notify at most once per outbox.Config.NotifyInterval, so
	// this is what picks up the events committed between two
	// notifications; it also keeps a poll-only relayer's latency low while
	// events flow. A negative value turns it off. Defaults to
	// DefaultBusyPollInterval (2ms).
	BusyPollInterval time.Duration
	// PollOnly disables LISTEN/NOTIFY, for connection poolers in transaction
	// mode (PgBouncer, Supavisor), which cannot hold a LISTEN. Defaults to
	// false.
	PollOnly bool
	// HoldOut is how long an aggregate whose oldest pending row failed
	// permanently (the broker refused it, or the relayer could not decode
	// it) is left out of claims before the row is tried again; each further
	// failure of the same row doubles it, up to MaxHoldOut, with 10%
	// jitter. Later rows of that aggregate wait too: order is kept. Holds
	// are recorded in the failures table, so every relayer honours them and
	// `outbox events retry` lifts them for all. Defaults to DefaultHoldOut
	// (1m).
	HoldOut time.Duration
	// MaxHoldOut caps the doubling of HoldOut. Defaults to
	// DefaultMaxHoldOut (30m).
	MaxHoldOut time.Duration
	// DisablePipelining makes the relayer claim its next batch only after
	// the previous one committed, in a round trip of its own. By default,
	// while a full batch is being published, the next one is claimed on a
	// second connection (so Pool needs two), and it is published only
	// once the first was acknowledged and committed in full; otherwise it
	// is rolled back unpublished. And a batch whose every row was
	// acknowledged commits in one round trip with the next claim, when
	// that follows within 10ms (the busy poll while events flow). Defaults
	// to false.
	DisablePipelining bool
	// Listener, when set, wakes the relayer from a LISTEN connection it
	// shares with the relayers of other outboxes of the same database
	// (NewListener, with these Tables among its own; the caller runs it).
	// Ignored with PollOnly. Defaults to nil: the relayer opens a LISTEN
	// connection of its own.
	Listener *Listener
	// LaneLease is how long a relayer with Common.ExactlyOnce holds its
	// lane without renewing it (it renews it with every claim, and at
	// least every third of it when idle). A relayer that dies or stalls
	// with a batch in flight blocks that batch's aggregates for about this
	// long, until another relayer adopts its lane; a relayer paused for
	// longer loses its lane and steps down. Defaults to DefaultLaneLease
	// (10s).
	LaneLease time.Duration
}

// BatchResult describes one claim-publish-mark cycle. For the WAL source
// (relay/walrelay) it describes one Publish call of a batch: Locked equals
// Claimed, nothing is Deferred (a parked event does not hold its
// aggregate), and Holds are the events it parked (Until zero: parked, not
// held).
type BatchResult struct {
	// Locked is how many pending rows the claim locked; Claimed of them were
	// the oldest pending rows of their aggregates and were published. The
	// rest waited behind a row another relayer holds.
	Locked, Claimed int
	// Dispatched rows the broker acknowledged and were marked.
	Dispatched int
	// DispatchedByTopic splits Dispatched by topic; nil when none was.
	DispatchedByTopic map[string]int
	// Permanent failures (held out), Transient failures (retried).
	Permanent, Transient int
	// Holds are the rows this batch held out, one per failed aggregate:
	// the row that failed, not the rows behind it; less any another
	// relayer held a moment before (the hold stands as it recorded it).
	Holds []Hold
	// Deferred rows that followed a failed row of their aggregate: left
	// pending so order is kept.
	Deferred int
	// Duration from claim to commit.
	Duration time.Duration
	// Latencies holds, per dispatched row, the time from its commit into the
	// outbox (created_at) to the broker's acknowledgement.
	Latencies []time.Duration
}

// Stats are a source's cumulative counters since it was created: one shape
// for both sources. The fields after FailedBatches only the WAL source
// fills; they stay zero for the polling relay.
type Stats struct {
	// Batches settled (for polling: committed).
	Batches int64
	// Claimed events taken into batches, again each time a batch is
	// retried (polling: each claim; WAL: each Publish call of a batch).
	Claimed int64
	// Dispatched events the broker acknowledged (with duplicates re-sent
	// after a restart or failover).
	Dispatched int64
	// PermanentFailures: events that failed for good (the polling relay
	// holds them out, the WAL source parks them); TransientFailures:
	// failures that are retried.
	PermanentFailures, TransientFailures int64
	// FailedBatches counts batches (publish attempts, for the WAL source)
	// that failed and backed off: broker or database unreachable; a WAL
	// leader stepping down is not counted.
	FailedBatches int64

	// Parked events (WAL source only) the broker refused for good or the
	// relayer could not decode: moved to the parked table, the stream went
	// on.
	Parked int64
	// Dropped (WAL source only): logical messages with the outbox's prefix
	// that were not events (non-transactional, message-mode events off,
	// no id), and events that could be neither published nor parked (the
	// parked table refused them with a data error, SQLSTATE class 22):
	// logged, not published, not parked.
	Dropped int64
	// QueuedBytesMax (WAL source only) is the most bytes (as MaxBatchBytes
	// counts them) the leader has held read ahead of the batch out: at
	// most about MaxBatchBytes plus one event.
	QueuedBytesMax int64
	// Heartbeats (WAL source only) read back from the stream.
	Heartbeats int64
	// AckedLSN (WAL source only) is the last position acknowledged to the
	// slot, a pglogrepl.LSN.
	AckedLSN uint64
	// Leading (WAL source only) is true while this relayer is the slot's
	// reader.
	Leading bool
}

// Hold is a row held out of claims after a permanent failure, as recorded
// in the failures table.
type Hold struct {
	EventID     int64
	AggregateID uuid.UUID
	Type        string
	// Reason is one of the Reason constants; Err the whole message.
	Reason, Err string
	// Attempts counts the failures recorded for the row.
	Attempts int
	// Until is when the row is tried again, unless an operator retries it
	// sooner.
	Until time.Time
}

// The polling relay is a Source.
var _ Source = (*Relayer)(nil)

// Relayer runs the claim-publish-mark loop. Create it with New, run it
// with Run.
type Relayer struct {
	cfg       Config
	log       *slog.Logger
	claimSQL  string
	binary    bool     // claimSQL is claimBinarySQL
	begin     []string // claimBeginStatements, or the partitioned layout's
	unmarkSQL string
	holdSQL   string
	// pendingSQL is the idle poll's probe (pause).
	pendingSQL string
	// lanes are the exactly-once relayer's statements (lanes.go).
	lanes   laneStatements
	obs     *Observer
	routing outbox.Routing // the Sink's, for TopicPrefix
	wake    chan struct{}

	batches, claimed, dispatched, permanent, transient, failedBatches atomic.Int64
}

// WithDefaults returns cfg with its zero fields set to their defaults
// (Common's by Common.WithDefaults). Negative durations are left for
// Validate to refuse, but for BusyPollInterval, where any negative value
// means off.
func (cfg Config) WithDefaults() Config {
	cfg.Common = cfg.Common.WithDefaults()
	switch {
	case cfg.BusyPollInterval == 0:
		cfg.BusyPollInterval = DefaultBusyPollInterval
	case cfg.BusyPollInterval < 0:
		cfg.BusyPollInterval = -1 // off
	}
	for _, f := range []struct {
		d   *time.Duration
		def time.Duration
	}{
		{&cfg.PollInterval, DefaultPollInterval},
		{&cfg.HoldOut, DefaultHoldOut},
		{&cfg.MaxHoldOut, DefaultMaxHoldOut},
		{&cfg.LaneLease, DefaultLaneLease},
	} {
		if *f.d == 0 {
			*f.d = f.def
		}
	}
	return cfg
}

// Validate reports the first field of cfg (with its defaults applied) the
// relayer cannot run with: Common's (Common.Validate), then its own.
func (cfg Config) Validate() error {
	if err := cfg.Common.Validate(); err != nil {
		return err
	}
	cfg = cfg.WithDefaults()
	if err := positiveDurations(map[string]time.Duration{
		"PollInterval": cfg.PollInterval, "HoldOut": cfg.HoldOut, "MaxHoldOut": cfg.MaxHoldOut, "LaneLease": cfg.LaneLease,
	}); err != nil {
		return err
	}
	if cfg.Listener != nil && !cfg.PollOnly && !cfg.Listener.listens(cfg.Tables) {
		return errNotListened
	}
	if cfg.MaxHoldOut < cfg.HoldOut {
		return fmt.Errorf("relay: MaxHoldOut (%s) is below HoldOut (%s); raise MaxHoldOut or lower HoldOut", cfg.MaxHoldOut, cfg.HoldOut)
	}
	return nil
}

// New validates cfg and applies its defaults.
func New(cfg Config) (*Relayer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	obs, err := NewObserver(cfg.Common)
	if err != nil {
		return nil, err
	}
	routing, err := cfg.Routing()
	if err != nil {
		return nil, err
	}
	return &Relayer{
		cfg:        cfg,
		obs:        obs,
		routing:    routing,
		log:        cfg.Logger.With("outbox", cfg.Tables.OutboxIdent()),
		claimSQL:   render(claimSQL, cfg.Tables),
		begin:      claimBeginStatements,
		unmarkSQL:  render(unmarkSQL, cfg.Tables),
		holdSQL:    render(holdSQL, cfg.Tables),
		pendingSQL: render(pendingSQL, cfg.Tables),
		lanes:      renderLanes(cfg.Tables, claimLanesSQL),
		wake:       make(chan struct{}, 1),
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

// Run relays until ctx is cancelled, then lets the batch in flight finish
// (within ShutdownTimeout) and returns nil. It returns an error only when
// it cannot start: the schema is missing or out of date, or the database is
// unreachable at start. Once running it rides out database and broker
// outages with backoff.
func (r *Relayer) Run(ctx context.Context) error {
	if err := r.checkSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: a stop, not a failure
		}
		return err
	}
	if err := r.detectLayout(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	batchCtx, stopBatchCtx := r.batchContext(ctx)
	defer stopBatchCtx()

	var wg sync.WaitGroup
	defer wg.Wait()
	defer r.listen(ctx, &wg)()
	if r.cfg.ExactlyOnce {
		return r.runLanes(ctx, batchCtx)
	}
	defer r.watchOrphanLanes(ctx, &wg)()

	r.log.Info("relay started", "batch_size", r.cfg.BatchSize, "poll_interval", r.cfg.PollInterval, "busy_poll_interval", r.cfg.BusyPollInterval, "poll_only", r.cfg.PollOnly)
	defer r.log.Info("relay stopped")
	// next is a batch claimed while the previous one was being published.
	var next *claimed
	defer func() {
		if next != nil {
			next.abandon(batchCtx)
		}
	}()
	// held is a batch published and settled whose COMMIT goes with the
	// next claim (holdCommit).
	var held *claimed
	defer func() {
		if held != nil {
			if err := r.commit(batchCtx, held); err != nil {
				r.log.Warn("relay stopping: the last batch did not commit; its rows will be sent again", "err", err)
			}
		}
	}()
	pace := newPacer(r.cfg)
	for ctx.Err() == nil {
		cur := next
		next = nil
		var err error
		if cur == nil {
			cur, err = r.claimBatch(batchCtx, pace.claimSize(), nil, held)
			held = nil
		}
		var res BatchResult
		full := false
		if err == nil {
			full = cur.locked >= cur.size
			res, next, err = r.relay(ctx, batchCtx, cur)
		}
		var action action
		var wait time.Duration
		if err == nil {
			action, wait = pace.afterBatch(res, full, next != nil)
			held, err = r.holdCommit(ctx, batchCtx, cur, action, wait)
		}
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, context.Canceled) {
				return nil
			}
			if !r.backOff(ctx, pace, err) {
				return nil
			}
			continue
		}
		if !r.pause(ctx, action, wait) {
			return nil
		}
	}
	return nil
}

// listen wakes the relayer on its outbox's notifications, through
// Config.Listener or a Listener of its own that wg runs until ctx ends;
// stop unsubscribes. A poll-only relayer listens to nothing.
func (r *Relayer) listen(ctx context.Context, wg *sync.WaitGroup) (stop func()) {
	if r.cfg.PollOnly {
		return func() {}
	}
	l := r.cfg.Listener
	if l == nil {
		l = NewListener(r.cfg.Pool, r.log, r.cfg.Tables)
		wg.Go(func() { l.run(ctx, r.cfg.BackoffMin, r.cfg.BackoffMax) })
	}
	return l.subscribe(r.cfg.Tables.Channel(), r.wake)
}

// maxHeldCommit is the longest pause a batch's COMMIT waits for, to go in
// one round trip with the next claim: the busy poll's (BusyPollInterval,
// 2ms by default) while events flow.
const maxHeldCommit = 10 * time.Millisecond

// holdCommit commits cur, unless finish left its COMMIT for later (a batch
// whose every row was acknowledged, claimed without pipelining) and the
// relayer claims again within maxHeldCommit: then it returns cur, whose
// COMMIT goes in one pipeline with the next claim (claimBatch). At a
// steady trickle every batch is a row or two, and its own COMMIT round
// trip cost the relayer as much CPU as the claim's. The rows stay locked,
// marked, uncommitted for that pause: other relayers skip them, and their
// aggregates' later rows, as they skip any batch being published.
func (r *Relayer) holdCommit(ctx, batchCtx context.Context, cur *claimed, a action, wait time.Duration) (*claimed, error) {
	if !cur.uncommitted {
		return nil, nil
	}
	if ctx.Err() == nil && (a == claimNow || a == pollLater && wait <= maxHeldCommit) {
		return cur, nil
	}
	return nil, r.commit(batchCtx, cur)
}

// checkSchema validates the outbox's schema unless SkipSchemaCheck.
func (r *Relayer) checkSchema(ctx context.Context) error {
	if r.cfg.SkipSchemaCheck {
		return nil
	}
	m, err := migrate.New(r.cfg.Tables)
	if err != nil {
		return err
	}
	if err := m.Validate(ctx, r.cfg.Pool); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return nil
}

// detectLayout picks the claim for the table's payload columns: with
// binary payloads on (or partly, while they are turned on or off: the
// columns exist), the claim that reads payload_bytes too. A table turned
// binary after this started gets rows without a JSON payload, which the
// claim holds (undecodable) until a restart picks the other claim. A
// partitioned table is claimed with a generic plan (claimBeginPartitioned).
func (r *Relayer) detectLayout(ctx context.Context) error {
	m, err := migrate.New(r.cfg.Tables)
	if err != nil {
		return err
	}
	st, err := m.BinaryPayloads(ctx, r.cfg.Pool)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	p, err := m.Partitioning(ctx, r.cfg.Pool)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	partitioned := p.Layout == migrate.LayoutPartitioned
	r.binary = st != migrate.BinaryOff
	claim := map[[2]bool]string{
		{false, false}: claimSQL, {true, false}: claimBinarySQL,
		{false, true}: claimPartitionedSQL, {true, true}: claimBinaryPartitionedSQL,
	}[[2]bool{r.binary, partitioned}]
	r.claimSQL = render(claim, r.cfg.Tables)
	r.lanes.claim = render(lanesClaim(claim), r.cfg.Tables)
	if partitioned {
		r.begin = claimBeginPartitionedStatements
	}
	return nil
}

// batchContext returns the context batches run in. The batch in flight
// must not die with ctx: it finishes, then Run returns. Only
// ShutdownTimeout after ctx's cancellation is it cut short. stop releases
// it.
func (r *Relayer) batchContext(ctx context.Context) (batchCtx context.Context, stop func()) {
	batchCtx, cancelBatch := context.WithCancel(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.ShutdownTimeout, cancelBatch)
		context.AfterFunc(batchCtx, func() { t.Stop() })
	})
	return batchCtx, func() {
		stopAfter()
		cancelBatch()
	}
}

// backOff counts a failed batch, logs it and sleeps the pacer's backoff.
// It returns false when ctx is cancelled meanwhile.
func (r *Relayer) backOff(ctx context.Context, pace *pacer, err error) bool {
	r.failedBatches.Add(1)
	r.obs.BatchError(err)
	attempt, d := pace.afterError()
	r.log.Warn("relay batch failed; backing off", "err", err, "attempt", attempt, "retry_in", d.Round(time.Millisecond))
	return backoff.Sleep(ctx, d)
}

// pause waits as the pacer said after a batch that went through: not at
// all, wait (not woken by notifications), or until wait passes or a
// notification comes. It returns false when ctx is cancelled meanwhile.
func (r *Relayer) pause(ctx context.Context, a action, wait time.Duration) bool {
	switch a {
	case claimNow:
	case probeLater:
		return backoff.Sleep(ctx, wait)
	case pollLater:
		timer := time.NewTimer(wait)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return false
			case <-r.wake:
				return true
			case <-timer.C:
			}
			// An idle relayer's poll (the wait is the poll interval) first
			// asks whether anything is pending: a claim that finds nothing
			// costs two round trips and a transaction, the probe one
			// statement. On a process relaying many idle outboxes, the
			// polls are most of what it does.
			if wait < r.cfg.PollInterval || r.anyPending(ctx) {
				return true
			}
			timer.Reset(wait)
		}
	}
	return true
}

// anyPending reports whether the outbox has a pending row, or the probe
// failed (the claim then meets the failure, and backs off).
func (r *Relayer) anyPending(ctx context.Context) bool {
	var found bool
	if err := r.cfg.Pool.QueryRow(ctx, r.pendingSQL).Scan(&found); err != nil {
		return true
	}
	return found
}

// claimed is a batch claimed and marked in its still open transaction.
type claimed struct {
	tx   *claimTx
	msgs []Message
	// bad are the rows the claim could not decode, by id.
	bad map[int64]error
	// refused are the rows publish failed before sending, by id.
	refused      map[int64]bool
	size, locked int // rows asked for, rows locked
	start        time.Time
	// uncommitted is set when finish published and settled the batch but
	// left its COMMIT to the caller (holdCommit); res is then its result,
	// reported once committed.
	uncommitted bool
	res         BatchResult
}

// abandon rolls the batch back: its rows return to pending, unpublished.
func (c *claimed) abandon(ctx context.Context) {
	c.tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the rows stay pending either way
}

// claimBatch opens a transaction and claims a batch in it. ahead are the
// rows of the batch this relayer is still publishing, which this one
// follows. The transaction's BEGIN goes in one round trip with the claim
// (a pipeline), not one of its own: at a steady trickle each claim
// returns a row or two, and a round trip costs the relayer about as much
// CPU as relaying one event.
//
// held, if not nil, is the previous batch, whose COMMIT goes first in
// the same pipeline, on its connection (holdCommit); it is reported once
// committed, and the claim fails if it did not commit.
func (r *Relayer) claimBatch(ctx context.Context, size int, ahead []int64, held *claimed) (*claimed, error) {
	start := time.Now()
	b := &pgx.Batch{}
	var conn *pgxpool.Conn
	if held != nil {
		conn, held.tx.conn = held.tx.conn, nil
		b.Queue("COMMIT")
	} else {
		var err error
		if conn, err = r.cfg.Pool.Acquire(ctx); err != nil {
			return nil, fmt.Errorf("begin: %w", err)
		}
	}
	tx := &claimTx{conn: conn}
	if ahead == nil {
		ahead = []int64{}
	}
	for _, q := range r.begin {
		b.Queue(q)
	}
	b.Queue(r.claimSQL, size, ahead, r.cfg.MaxBatchBytes)
	msgs, bad, locked, err := r.sendClaim(ctx, conn.SendBatch(ctx, b), held)
	if err != nil {
		tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // reporting the claim's error
		return nil, err
	}
	return &claimed{tx: tx, msgs: msgs, bad: bad, size: size, locked: locked, start: start}, nil
}

// sendClaim reads the results of the claim's pipeline: BEGIN's, then the
// claim's rows.
func (r *Relayer) sendClaim(ctx context.Context, br pgx.BatchResults, held *claimed) ([]Message, map[int64]error, int, error) {
	if held != nil {
		tag, err := br.Exec()
		if err == nil && tag.String() == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback
		}
		if err != nil {
			br.Close()
			return nil, nil, 0, fmt.Errorf("commit after publishing %d rows (they will be sent again): %w", held.res.Dispatched, err)
		}
		r.report(held, held.res)
	}
	for range r.begin {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, nil, 0, fmt.Errorf("begin: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, nil, 0, fmt.Errorf("claim: %w", err)
	}
	msgs, bad, locked, err := r.claim(rows)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("claim: %w", cerr)
	}
	if err == nil {
		err = ctx.Err()
	}
	return msgs, bad, locked, err
}

// claimTx is a claim's transaction on a connection it holds from BEGIN
// (sent with the claim) to COMMIT or ROLLBACK. A connection it leaves in
// a transaction, or busy, the pool closes rather than reuses.
type claimTx struct {
	conn *pgxpool.Conn
}

func (t *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

// Commit commits, failing with pgx.ErrTxCommitRollback when the server
// rolled back instead (the transaction had failed).
func (t *claimTx) Commit(ctx context.Context) error {
	if t.conn == nil {
		return pgx.ErrTxClosed
	}
	tag, err := t.conn.Exec(ctx, "COMMIT")
	t.conn.Release()
	t.conn = nil
	if err != nil {
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// Rollback rolls back; after Commit it does nothing.
func (t *claimTx) Rollback(ctx context.Context) error {
	if t.conn == nil {
		return pgx.ErrTxClosed
	}
	_, err := t.conn.Exec(ctx, "ROLLBACK")
	t.conn.Release()
	t.conn = nil
	return err
}

// relay publishes and commits cur. When cur is a full batch, so more rows
// are waiting, it claims the next batch meanwhile and returns it, unless
// cur did not go through in full: the next batch may hold later rows of an
// aggregate whose row in cur failed, so it is rolled back unpublished. It
// is not claimed once ctx (Run's) is cancelled.
func (r *Relayer) relay(ctx, batchCtx context.Context, cur *claimed) (BatchResult, *claimed, error) {
	if r.cfg.DisablePipelining || len(cur.msgs) == 0 || cur.locked < cur.size || ctx.Err() != nil {
		// Without pipelining, each batch commits before the next claim is
		// sent, in a round trip of its own.
		res, err := r.finish(batchCtx, cur, !r.cfg.DisablePipelining)
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
		res, err := r.finish(batchCtx, cur, false)
		done <- outcome{res, err}
	}()
	next, nerr := r.claimBatch(batchCtx, r.cfg.BatchSize, ahead, nil)
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
// acknowledge to pending, records the holds of rows that failed for good
// and commits. With mayHold, a batch whose every row was acknowledged is
// left uncommitted, for the caller to commit (holdCommit).
func (r *Relayer) finish(ctx context.Context, c *claimed, mayHold bool) (BatchResult, error) {
	tx, msgs := c.tx, c.msgs
	res := BatchResult{Locked: c.locked, Claimed: len(msgs)}
	if len(msgs) == 0 {
		return res, tx.Commit(ctx)
	}
	held := false
	defer func() {
		if !held {
			tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
		}
	}()

	errs, err := r.publish(ctx, c)
	if err != nil {
		return res, err
	}
	ackedAt := time.Now()
	unmark, holds, failed, firstTransient := r.settle(msgs, errs, ackedAt, &res)
	for _, i := range failed {
		r.obs.PublishFailure(PublishFailure{Message: msgs[i], Err: errs[i], Refused: c.refused[msgs[i].ID]})
	}
	if len(unmark) > 0 {
		if _, err := tx.Exec(ctx, r.unmarkSQL, unmark); err != nil {
			return res, fmt.Errorf("return %d unacknowledged rows to pending: %w", len(unmark), err)
		}
	}
	if len(holds) > 0 {
		if holds, err = r.recordHolds(ctx, tx, holds); err != nil {
			return res, err
		}
	}
	if mayHold && res.Dispatched == len(msgs) {
		held, c.uncommitted, c.res = true, true, res
		return res, nil
	}
	if err := tx.Commit(ctx); err != nil {
		// The broker has the rows but they stay pending: they will be
		// published again. At-least-once.
		return res, fmt.Errorf("commit after publishing %d rows (they will be sent again): %w", res.Dispatched, err)
	}
	res.Holds = holds
	r.logHolds(holds)
	r.report(c, res)
	if firstTransient != nil {
		return res, fmt.Errorf("publish: %d of %d rows not acknowledged: %w", res.Transient, len(msgs), firstTransient)
	}
	return res, nil
}

// logHolds logs each hold a batch recorded, with what an operator can do.
func (r *Relayer) logHolds(holds []Hold) {
	for _, h := range holds {
		r.log.Error("event held: it cannot be published, so its aggregate waits behind it",
			"event_id", h.EventID, "aggregate_id", h.AggregateID, "type", clip.Text(h.Type, 200), "reason", h.Reason, "err", h.Err,
			"attempt", h.Attempts, "held_until", h.Until.Format(time.RFC3339),
			"retry_now", fmt.Sprintf("outbox events retry %d --yes", h.EventID), "park", fmt.Sprintf("outbox events park %d --reason ... --yes", h.EventID))
	}
}

// commit commits a batch finish left uncommitted and reports it.
func (r *Relayer) commit(ctx context.Context, c *claimed) error {
	if err := c.tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit after publishing %d rows (they will be sent again): %w", c.res.Dispatched, err)
	}
	r.report(c, c.res)
	return nil
}

// report counts a committed batch and tells the hooks.
func (r *Relayer) report(c *claimed, res BatchResult) {
	res.Duration = time.Since(c.start)
	r.batches.Add(1)
	r.claimed.Add(int64(res.Claimed))
	r.dispatched.Add(int64(res.Dispatched))
	r.permanent.Add(int64(res.Permanent))
	r.transient.Add(int64(res.Transient))
	r.obs.Batch(res)
}

// publish sends the rows of c that can be sent and returns one error per
// row. A row that cannot be published (the claim could not decode it, its
// type routes to no topic, or it breaks its contract) fails before sending
// (c.refused), and the rows of its aggregate after it are not sent either,
// so nothing overtakes it.
func (r *Relayer) publish(ctx context.Context, c *claimed) ([]error, error) {
	errs, send, sendIdx := r.presend(c)
	if len(send) == 0 {
		return errs, nil
	}
	perr, err := r.obs.Publish(ctx, send)
	if err != nil {
		return nil, err
	}
	for j, i := range sendIdx {
		errs[i] = perr[j]
	}
	return errs, nil
}

// presend says, per row of c, why it cannot be sent (errs: refused, or
// deferred behind a refused row of its aggregate), and returns the rows
// that can be, with their indexes in c.msgs.
func (r *Relayer) presend(c *claimed) (errs []error, send []Message, sendIdx []int) {
	msgs := c.msgs
	errs = make([]error, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		err := c.bad[m.ID]
		if err == nil {
			m.Topic, err = r.routing.Destination(m.Type)
			err = PermanentReason(ReasonInvalidTopic, err)
		}
		errs[i] = err
	}
	CheckContracts(r.cfg.Contracts, msgs, errs)
	var blocked map[uuid.UUID]bool
	send = make([]Message, 0, len(msgs))
	sendIdx = make([]int, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if blocked[m.AggregateID] {
			errs[i] = errDeferred
			continue
		}
		if errs[i] != nil {
			if c.refused == nil {
				c.refused = map[int64]bool{}
			}
			c.refused[m.ID] = true
			if blocked == nil {
				blocked = map[uuid.UUID]bool{}
			}
			blocked[m.AggregateID] = true
			continue
		}
		send = append(send, *m)
		sendIdx = append(sendIdx, i)
	}
	return errs, send, sendIdx
}

// settle applies the publish results to res and says which rows go back to
// pending, which are held and which count as failures (by index). Per aggregate, only the acknowledged prefix
// is marked: a row acknowledged after a failed row of its aggregate stays
// pending and is sent again after it (at-least-once), rather than being
// marked out of order. The failure belongs to the aggregate's first failed
// row; the rows behind it are deferred, whatever their own result, and
// never recorded as failures themselves.
func (r *Relayer) settle(msgs []Message, errs []error, ackedAt time.Time, res *BatchResult) (unmark []int64, holds []Hold, failures []int, firstTransient error) {
	var failed map[uuid.UUID]bool
	for i, m := range msgs {
		err := errs[i]
		if err == nil && !failed[m.AggregateID] {
			res.Dispatched++
			if res.DispatchedByTopic == nil {
				res.DispatchedByTopic = map[string]int{}
			}
			res.DispatchedByTopic[m.Topic]++
			res.Latencies = append(res.Latencies, ackedAt.Sub(m.CreatedAt))
			continue
		}
		unmark = append(unmark, m.ID)
		if failed[m.AggregateID] || err == nil || errors.Is(err, errDeferred) {
			res.Deferred++
			continue
		}
		if failed == nil {
			failed = map[uuid.UUID]bool{}
		}
		failed[m.AggregateID] = true
		failures = append(failures, i)
		if IsPermanent(err) {
			res.Permanent++
			holds = append(holds, Hold{EventID: m.ID, AggregateID: m.AggregateID, Type: m.Type, Reason: ReasonOf(err), Err: clip.Text(err.Error(), maxErrorLen)})
			continue
		}
		res.Transient++
		if firstTransient == nil {
			firstTransient = err
		}
	}
	return unmark, holds, failures, firstTransient
}

// recordHolds writes holds into the failures table within the batch's
// transaction and returns them with their attempt counts and hold ends,
// less those another relayer had just recorded (holdSQL).
func (r *Relayer) recordHolds(ctx context.Context, tx interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, holds []Hold) ([]Hold, error) {
	ids := make([]int64, len(holds))
	aggs := make([]uuid.UUID, len(holds))
	types := make([]string, len(holds))
	reasons := make([]string, len(holds))
	msgs := make([]string, len(holds))
	for i, h := range holds {
		ids[i], aggs[i], types[i], reasons[i], msgs[i] = h.EventID, h.AggregateID, h.Type, h.Reason, h.Err
	}
	rows, err := tx.Query(ctx, r.holdSQL, ids, aggs, types, reasons, msgs, r.cfg.HoldOut.Microseconds(), r.cfg.MaxHoldOut.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("record %d held rows: %w", len(holds), err)
	}
	byID := make(map[int64]int, len(holds))
	for i, h := range holds {
		byID[h.EventID] = i
	}
	var (
		id       int64
		attempts int
		until    time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &attempts, &until}, func() error {
		i := byID[id]
		holds[i].Attempts, holds[i].Until = attempts, until
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record %d held rows: %w", len(holds), err)
	}
	return slices.DeleteFunc(holds, func(h Hold) bool { return h.Attempts == 0 }), nil
}

// maxErrorLen caps a recorded error: enough for any broker or relayer
// message, bounded in case a publisher quotes a payload.
const maxErrorLen = 2000

// probeSize is the claim of a relayer whose last claims all waited behind
// another relayer: small, so it holds few rows the other needs.
const probeSize = 100

var errDeferred = errors.New("deferred behind an earlier failed row of its aggregate")

// claim reads the claim's rows.
func (r *Relayer) claim(rows pgx.Rows) ([]Message, map[int64]error, int, error) {
	defer rows.Close()
	var err error
	// Sized by what the claim returns, not by what it asked for: at a
	// steady trickle most claims return a row or two, and a slice of
	// BatchSize messages per claim (~0.5 MiB at 5,000) kept the garbage
	// collector busy for nothing.
	msgs := make([]Message, 0, 4)
	var bad map[int64]error
	var locked int64
	for rows.Next() {
		// Nullable: the one row that only carries the count has NULLs.
		var (
			m       Message
			id      *int64
			typ     *string
			created *time.Time
			headers []byte
			binary  []byte
			ct      *string
		)
		dest := []any{&id, &m.AggregateID, &typ, &m.Payload, &headers, &created, &locked}
		if r.binary {
			dest = append(dest, &binary, &ct)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, 0, fmt.Errorf("claim: scan: %w", err)
		}
		if id == nil {
			continue
		}
		m.ID, m.Type, m.CreatedAt = *id, *typ, *created
		if ct != nil {
			m.Payload, m.ContentType = binary, *ct
			if m.Payload == nil {
				m.Payload = []byte{}
			}
		}
		// A row written by hand can hold any JSONB in headers: it fails on
		// its own, never the claim.
		m.Headers, err = rowheaders.Decode(headers, PermanentReason)
		if err == nil && m.Payload == nil {
			err = PermanentReason(ReasonUndecodable, errors.New("the row has no JSON payload: binary payloads were turned on for the table after this relayer started; restart it"))
		}
		if err != nil {
			if bad == nil {
				bad = map[int64]error{}
			}
			bad[m.ID] = err
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, 0, fmt.Errorf("claim: %w", err)
	}
	slices.SortFunc(msgs, func(a, b Message) int { return cmp.Compare(a.ID, b.ID) })
	return msgs, bad, int(locked), nil
}
