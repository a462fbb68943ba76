package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// runExactlyOnce measures what --exactly-once costs the polling relay,
// against at-least-once in the same run: the drain of a preload, and the
// latency from an emitter's commit to the moment a read_committed
// consumer sees the record (for at-least-once records are visible at the
// broker's acknowledgement; with transactions, at the commit).
func runExactlyOnce(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	n := int64(cfg.Events)
	rounds := pick(cfg.Short, 1, 3)
	e, err := s.newEnv(ctx, "exactlyonce", int32(latencyWriters(cfg.Writers, 1000)))
	if err != nil {
		return nil, err
	}
	defer e.close()
	res := &Result{}
	res.param("drain", "%s pending events over %s aggregates, 1 relayer with defaults (batch 5,000), at-least-once vs --exactly-once, %d rounds interleaved, median reported", thousands(n), thousands(int64(cfg.Aggregates)), rounds)
	res.param("latency", "one event per transaction at 1,000/s for %s; commit-to-visible: from the emitter's COMMIT returning to a read_committed consumer receiving the record", pick(cfg.Short, "1s", "10s"))
	modes := []struct {
		key, name string
		eos       bool
	}{{"at_least_once", "at-least-once", false}, {"exactly_once", "--exactly-once", true}}

	drains := make([][]drainResult, len(modes))
	for round := range rounds {
		for i, m := range modes {
			s.progress("exactlyonce: round %d/%d: drain, %s", round+1, rounds, m.name)
			d, err := drainEOS(ctx, s, e, n, m.eos)
			if err != nil {
				return nil, fmt.Errorf("drain %s: %w", m.name, err)
			}
			drains[i] = append(drains[i], d)
		}
	}
	t := Table{Title: "exactly-once vs at-least-once, polling relay", Columns: []string{"mode", "drain ev/s (median)", "batches", "visible p50 ms", "visible p99 ms", "events"}}
	for i, m := range modes {
		slices.SortFunc(drains[i], func(a, b drainResult) int { return cmp.Compare(a.rate(), b.rate()) })
		med := drains[i][len(drains[i])/2]
		s.progress("exactlyonce: latency at 1,000/s, %s", m.name)
		lat, err := visibleLatency(ctx, s, e, m.eos, pick(cfg.Short, time.Second, 10*time.Second))
		if err != nil {
			return nil, fmt.Errorf("latency %s: %w", m.name, err)
		}
		p50, p99 := percentile(lat, 50), percentile(lat, 99)
		t.Rows = append(t.Rows, []string{m.name, rate(med.rate()), thousands(med.batches), ms(p50), ms(p99), thousands(int64(len(lat)))})
		res.metric(m.key+".drain_per_s", med.rate())
		res.metric(m.key+".visible_p50_ms", float64(p50)/float64(time.Millisecond))
		res.metric(m.key+".visible_p99_ms", float64(p99)/float64(time.Millisecond))
	}
	res.Tables = append(res.Tables, t)
	drainRatio := res.Metrics["exactly_once.drain_per_s"] / res.Metrics["at_least_once.drain_per_s"]
	p99Ratio := res.Metrics["exactly_once.visible_p99_ms"] / res.Metrics["at_least_once.visible_p99_ms"]
	res.metric("drain_ratio", drainRatio)
	res.metric("visible_p99_ratio", p99Ratio)
	res.target("exactly-once drain", ">= 0.9x at-least-once", fmt.Sprintf("%.2fx", drainRatio), drainRatio >= 0.9)
	res.target("exactly-once commit-to-visible p99", "<= 1.5x at-least-once", fmt.Sprintf("%.2fx", p99Ratio), p99Ratio <= 1.5)
	return res, nil
}

// eosSink returns a mod that makes a relayer publish to b in
// transactions, and what closes its clients.
func eosSink(b *broker) (func(*relay.Config), func()) {
	var mu sync.Mutex
	var clients []*kgo.Client
	mod := func(c *relay.Config) {
		cl, err := kafkapub.NewPublisherClient(b.cfg)
		if err != nil {
			return // relay.New then fails on the plain sink's missing transactions
		}
		mu.Lock()
		clients = append(clients, cl)
		mu.Unlock()
		tp, err := kafkapub.NewTxPublisher(cl, kafkapub.PublisherConfig{}, kafkapub.TxConfig{Client: b.cfg})
		if err != nil {
			return
		}
		c.Sink, c.ExactlyOnce = tp, true
	}
	return mod, func() {
		mu.Lock()
		defer mu.Unlock()
		for _, cl := range clients {
			cl.Close()
		}
	}
}

// drainEOS drains a fresh preload with one relayer, with or without
// exactly-once.
func drainEOS(ctx context.Context, s *session, e *env, n int64, eos bool) (drainResult, error) {
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
		return drainResult{}, err
	}
	b, err := s.startBroker()
	if err != nil {
		return drainResult{}, err
	}
	defer b.close()
	var mod func(*relay.Config)
	if eos {
		var closeAll func()
		mod, closeAll = eosSink(b)
		defer closeAll()
	}
	return e.drainWithRelayers(ctx, b, 1, n, mod)
}

// visibleLatency emits at 1,000 events/s for window with one relayer
// running and returns the sorted commit-to-visible latencies, as a
// read_committed consumer of the topic sees them.
func visibleLatency(ctx context.Context, s *session, e *env, eos bool, window time.Duration) ([]time.Duration, error) {
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()); err != nil {
		return nil, err
	}
	b, err := s.startBroker()
	if err != nil {
		return nil, err
	}
	defer b.close()
	prefix := fmt.Sprintf("bench%s_%s_", e.id, randomID())
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables, TopicPrefix: prefix})
	if err != nil {
		return nil, err
	}
	seen, stopReading, err := readVisible(ctx, b, prefix+"order")
	if err != nil {
		return nil, err
	}
	defer stopReading()
	var mod func(*relay.Config)
	if eos {
		var closeAll func()
		mod, closeAll = eosSink(b)
		defer closeAll()
	}
	g, err := e.startRelayers(ctx, b, 1, prefix, false, mod)
	if err != nil {
		return nil, err
	}
	defer g.stop() //nolint:errcheck // stopped below
	time.Sleep(300 * time.Millisecond)
	clock := &ackClock{acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
	em, err := emitAtRate(ctx, s, e, p, clock, latencyRun{rate: 1000}, window, latencyWriters(s.cfg.Writers, 1000))
	if err != nil {
		return nil, err
	}
	if _, err := g.waitFor(ctx, em.events, 30*time.Second); err != nil {
		return nil, err
	}
	if err := g.stop(); err != nil {
		return nil, err
	}
	return seen.latencies(ctx, clock, em.events)
}

// visibility notes when a read_committed consumer first received each
// event.
type visibility struct {
	mu   sync.Mutex
	seen map[int64]time.Time
}

// readVisible consumes topic on b with read_committed isolation until
// stop is called.
func readVisible(ctx context.Context, b *broker, topic string) (*visibility, func(), error) {
	opts, err := b.cfg.Options()
	if err != nil {
		return nil, nil, err
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(10*time.Millisecond), kgo.MetadataMinAge(100*time.Millisecond))...)
	if err != nil {
		return nil, nil, err
	}
	v := &visibility{seen: map[int64]time.Time{}}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for rctx.Err() == nil {
			fs := cl.PollFetches(rctx)
			now := time.Now()
			v.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == outbox.HeaderEventID {
						if id, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
							if _, ok := v.seen[id]; !ok {
								v.seen[id] = now
							}
						}
					}
				}
			})
			v.mu.Unlock()
		}
	})
	return v, func() { cancel(); wg.Wait(); cl.Close() }, nil
}

// latencies waits until the consumer saw want events (or 30 s) and pairs
// each emitter's commit with its visibility.
func (v *visibility) latencies(ctx context.Context, clock *ackClock, want int64) ([]time.Duration, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		v.mu.Lock()
		got := int64(len(v.seen))
		v.mu.Unlock()
		if got >= want {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("a read_committed consumer saw %d of %d events", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	clock.mu.Lock()
	defer clock.mu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	return sinceCommit(clock.commited, v.seen, "visible")
}
