package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
)

type latencyRun struct {
	rate int
	// pollOnly runs the relayer without LISTEN and the producer without
	// NOTIFY, as behind a pooler in transaction mode.
	pollOnly bool
	// notifyEvery makes the producer notify on every commit instead of at
	// most once per NotifyInterval (the default).
	notifyEvery bool
}

func runLatency(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	window := pick(cfg.Short, 500*time.Millisecond, 10*time.Second)
	e, err := s.newEnv(ctx, "latency", int32(latencyWriters(cfg.Writers, 5000)))
	if err != nil {
		return nil, err
	}
	defer e.close()

	res := &Result{}
	res.param("load", "one event per transaction (BEGIN; Emit; COMMIT) paced at a fixed rate for %s by max(%d, rate/200) writers, over %s aggregates", window, cfg.Writers, thousands(int64(cfg.Aggregates)))
	res.param("relay", "one relayer, default settings (batch 5,000, poll interval 1s, busy poll interval 2ms); LISTEN/NOTIFY, or PollOnly")
	res.param("latency", "commit-to-ack: from the moment the emitter's COMMIT returned to the moment the broker acknowledged the record (the relay's publisher returned); 'from tx start' is the relay's own BatchResult.Latencies, from the row's created_at (its transaction's start), so it adds the commit itself")

	t := Table{Title: "commit-to-broker-ack latency", Columns: []string{"rate", "wake-up", "writers", "achieved ev/s", "events", "p50 ms", "p99 ms", "max ms", "p50 from tx start", "emit tx p50 ms"}}
	runs := []latencyRun{{rate: 1000}, {rate: 1000, pollOnly: true}, {rate: 1000, notifyEvery: true},
		{rate: 5000}, {rate: 5000, pollOnly: true}, {rate: 5000, notifyEvery: true}}
	for _, r := range runs {
		mode, key := "defaults: LISTEN/NOTIFY (<= 1 per 10 ms) + busy polling", "notify"
		switch {
		case r.pollOnly:
			mode, key = "poll-only (1s), no NOTIFY, busy polling", "poll"
		case r.notifyEvery:
			mode, key = "NOTIFY on every commit", "notify_every"
		}
		s.progress("latency: %d events/s, %s", r.rate, mode)
		st, err := latencyOnce(ctx, s, e, r, window)
		if err != nil {
			return nil, fmt.Errorf("%d events/s %s: %w", r.rate, mode, err)
		}
		p50, p99, mx := percentile(st.lat, 50), percentile(st.lat, 99), percentile(st.lat, 100)
		t.Rows = append(t.Rows, []string{thousands(int64(r.rate)) + "/s", mode, strconv.Itoa(st.writers), rate(st.achieved), thousands(st.events),
			ms(p50), ms(p99), ms(mx), ms(percentile(st.fromStart, 50)), ms(percentile(st.commit, 50))})
		prefix := fmt.Sprintf("latency.%d.%s.", r.rate, key)
		res.metric(prefix+"p50_ms", float64(p50)/float64(time.Millisecond))
		res.metric(prefix+"p99_ms", float64(p99)/float64(time.Millisecond))
		res.metric(prefix+"max_ms", float64(mx)/float64(time.Millisecond))
		res.metric(prefix+"achieved_per_s", st.achieved)
		res.metric(prefix+"events", float64(st.events))
	}
	res.Tables = append(res.Tables, t)
	p50, p99 := res.Metrics["latency.1000.notify.p50_ms"], res.Metrics["latency.1000.notify.p99_ms"]
	res.target("latency p50 @1,000/s", "<= 5 ms, LISTEN/NOTIFY, defaults", fmt.Sprintf("%.2f ms (poll-only: %.0f ms)", p50, res.Metrics["latency.1000.poll.p50_ms"]), p50 <= 5)
	res.target("latency p99 @1,000/s", "<= 15 ms, LISTEN/NOTIFY, defaults", fmt.Sprintf("%.2f ms (poll-only: %.0f ms)", p99, res.Metrics["latency.1000.poll.p99_ms"]), p99 <= 15)
	res.note("poll-only: the first event after a quiet period waits up to the poll interval (1s default); while events flow, busy polling (2 ms, doubling while nothing is found) keeps the wait short")
	return res, nil
}

// latencyWriters is how many emitters a rate needs: each transaction
// waits for its commit's fsync, so one writer manages a few hundred a
// second.
func latencyWriters(writers, rate int) int { return max(writers, rate/200) }

type latencyStats struct {
	events    int64
	writers   int
	achieved  float64
	lat       []time.Duration // sorted commit-to-ack
	fromStart []time.Duration // sorted BatchResult.Latencies
	commit    []time.Duration // sorted emit transaction durations
}

// ackClock wraps the relay's publisher and notes when each event was
// acknowledged; emitters note when each commit returned. Their difference
// is commit-to-ack, without the commit itself.
type ackClock struct {
	relay.Sink
	mu       sync.Mutex
	acked    map[int64]time.Time
	commited map[int64]time.Time
}

func (c *ackClock) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := c.Sink.Publish(ctx, msgs)
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range msgs {
		if errs[i] == nil {
			if _, ok := c.acked[m.ID]; !ok {
				c.acked[m.ID] = now
			}
		}
	}
	return errs
}

func (c *ackClock) committed(id int64, at time.Time) {
	c.mu.Lock()
	c.commited[id] = at
	c.mu.Unlock()
}

// latencies pairs commits with acks. The relayer can see a commit a moment
// before the emitter's COMMIT returns; such an event counts as 0.
func (c *ackClock) latencies() ([]time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return sinceCommit(c.commited, c.acked, "acknowledged")
}

// sinceCommit returns, sorted, how long after its commit each committed
// event was at (acknowledged, seen), 0 for one at before its commit; an
// event committed but not in at is an error, saying it was never what.
func sinceCommit(committed, at map[int64]time.Time, what string) ([]time.Duration, error) {
	out := make([]time.Duration, 0, len(committed))
	for id, c := range committed {
		t, ok := at[id]
		if !ok {
			return nil, fmt.Errorf("event %d committed but never %s", id, what)
		}
		out = append(out, max(0, t.Sub(c)))
	}
	slices.Sort(out)
	return out, nil
}

// latencyOnce runs one relayer and emits at a steady rate for window, then
// waits until every event is dispatched.
func latencyOnce(ctx context.Context, s *session, e *env, r latencyRun, window time.Duration) (latencyStats, error) {
	var st latencyStats
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()); err != nil {
		return st, err
	}
	b, err := s.startBroker()
	if err != nil {
		return st, err
	}
	defer b.close()
	prefix := fmt.Sprintf("bench%s_%s_", e.id, randomID())
	pcfg := outbox.Config{Tables: e.tables, TopicPrefix: prefix, DisableNotify: r.pollOnly}
	if r.notifyEvery {
		pcfg.NotifyInterval = -1
	}
	p, err := outbox.NewProducer(pcfg)
	if err != nil {
		return st, err
	}
	clock := &ackClock{acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
	g, err := e.startRelayers(ctx, b, 1, prefix, true, func(c *relay.Config) {
		c.PollOnly = r.pollOnly
		clock.Sink = c.Sink
		c.Sink = clock
	})
	if err != nil {
		return st, err
	}
	defer g.stop() //nolint:errcheck // stopped below; a second stop is a no-op
	// Let the relayer finish its first (empty) poll and start listening.
	time.Sleep(300 * time.Millisecond)

	st.writers = latencyWriters(s.cfg.Writers, r.rate)
	em, err := emitAtRate(ctx, s, e, p, clock, r, window, st.writers)
	if err != nil {
		return st, err
	}
	total := em.events
	if _, err := g.waitFor(ctx, total, 30*time.Second); err != nil {
		return st, err
	}
	if err := g.stop(); err != nil {
		return st, err
	}
	d := drainResult{events: g.dispatched.Load()}
	if err := e.checkDrained(ctx, b, prefix+"order", total, &d); err != nil {
		return st, err
	}
	st.events = total
	st.achieved = perSecond(total, em.elapsed)
	st.fromStart = slices.Clone(g.latencies())
	slices.Sort(st.fromStart)
	if int64(len(st.fromStart)) != total {
		return st, fmt.Errorf("%d latencies for %d events", len(st.fromStart), total)
	}
	if st.lat, err = clock.latencies(); err != nil {
		return st, err
	}
	st.commit = em.commit
	slices.Sort(st.commit)
	return st, nil
}

// emitOutcome is what emitAtRate did.
type emitOutcome struct {
	events  int64
	elapsed time.Duration
	commit  []time.Duration // emit transaction durations, unsorted
}

// emitAtRate emits one event per transaction from writers goroutines,
// paced at r.rate, for window, and notes each commit on clock. It returns
// the first emit error, if any.
func emitAtRate(ctx context.Context, s *session, e *env, p *outbox.Producer, clock *ackClock, r latencyRun, window time.Duration, writers int) (emitOutcome, error) {
	aggs := make([]uuid.UUID, s.cfg.Aggregates)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	// Emitting stops at the end of the window even when the database
	// cannot keep up with the rate; the achieved rate says so.
	limit := int64(float64(r.rate) * window.Seconds())
	var emitted atomic.Int64
	period := time.Second / time.Duration(r.rate)
	var (
		next   atomic.Int64
		mu     sync.Mutex
		commit []time.Duration
		errs   []error
		wg     sync.WaitGroup
	)
	start := time.Now()
	for range writers {
		wg.Go(func() {
			var mine []time.Duration
			defer func() { mu.Lock(); commit = append(commit, mine...); mu.Unlock() }()
			for {
				i := next.Add(1) - 1
				if i >= limit || time.Since(start) >= window {
					return
				}
				if d := time.Until(start.Add(time.Duration(i) * period)); d > 0 {
					time.Sleep(d)
				}
				o := newOrder(int(i))
				t0 := time.Now()
				var id int64
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					var err error
					id, err = p.Emit(ctx, tx, outbox.Event{AggregateID: aggs[int(i)%len(aggs)], Type: "order.placed", Payload: o})
					return err
				})
				done := time.Now()
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				clock.committed(id, done)
				emitted.Add(1)
				mine = append(mine, done.Sub(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(errs) > 0 {
		return emitOutcome{}, errs[0]
	}
	return emitOutcome{events: emitted.Load(), elapsed: elapsed, commit: commit}, nil
}
