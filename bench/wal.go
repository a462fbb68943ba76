package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// runWAL compares the polling relay with the WAL source on one
// wal_level=logical server, in one run: drain throughput, commit-to-ack
// latency, and what relaying costs the business transactions.
func runWAL(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	url := cfg.WALDatabaseURL
	if url == "" {
		s.progress("wal: starting a throwaway wal_level=logical cluster")
		c, err := tmppg.Logical(ctx, 10, map[string]string{"max_connections": "150", "max_slot_wal_keep_size": "4GB"})
		if err != nil {
			return nil, fmt.Errorf("the wal scenario needs a server with wal_level=logical; starting a throwaway one failed (set --wal-database-url to a server with wal_level=logical and a role with REPLICATION): %w", err)
		}
		defer func() {
			if err := c.Stop(); err != nil {
				s.progress("wal: %v", err)
			}
		}()
		url = c.URL()
	}
	ws, err := s.on(ctx, url)
	if err != nil {
		return nil, err
	}
	defer ws.admin.Close()
	e, err := ws.newEnv(ctx, "wal", int32(cfg.Writers+4))
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.exec(ctx, ordersDDL); err != nil {
		return nil, err
	}

	n := int64(cfg.Events)
	latWindow := pick(cfg.Short, 500*time.Millisecond, 10*time.Second)
	bizWindow := pick(cfg.Short, 2*time.Second, 10*time.Second)
	res := &Result{}
	var version string
	if err := ws.admin.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return nil, err
	}
	server := "throwaway cluster (internal/tmppg)"
	if cfg.WALDatabaseURL != "" {
		server = "--wal-database-url"
	}
	res.param("server", "%s, Postgres %s, wal_level=logical, fsync=%s, synchronous_commit=%s; the same server, schema and dev broker for every row",
		server, version, setting(ctx, e, "fsync"), setting(ctx, e, "synchronous_commit"))
	res.param("poll", "relay.New with defaults (batch 5,000, LISTEN/NOTIFY, busy polling), 1 relayer")
	res.param("wal", "walrelay.New with defaults (batch 5,000, pgoutput, status update every 1s); slot and publication created before the events and dropped after each row")
	res.param("drain", "%s events over %s aggregates preloaded in one INSERT, then VACUUM ANALYZE and CHECKPOINT; timed from the relayer's start to the last event's broker ack (wal: includes taking the lead and starting the stream)", thousands(n), thousands(int64(cfg.Aggregates)))
	res.param("latency", "one event per transaction at 1,000/s for %s by %d writers; commit returned to broker ack", latWindow, latencyWriters(cfg.Writers, 1000))
	res.param("business", "%d writers for %s each: BEGIN; INSERT INTO orders; [Emit, defaults]; COMMIT, tables truncated before each row", cfg.Writers, bizWindow)

	if err := walDrain(ctx, ws, e, res, n); err != nil {
		return res, err
	}
	if err := walLatency(ctx, ws, e, res, latWindow); err != nil {
		return res, err
	}
	if err := walBusiness(ctx, ws, e, res, bizWindow); err != nil {
		return res, err
	}

	m := res.Metrics
	d := m["wal.drain.ratio"]
	res.target("wal drain", ">= 1.5x the polling relay of the same run", fmt.Sprintf("%.2fx (%s vs %s events/s)", d, rate(m["wal.drain.wal.events_per_s"]), rate(m["wal.drain.poll.events_per_s"])), d >= 1.5)
	p50, p99 := m["wal.latency.wal.p50_ms"], m["wal.latency.wal.p99_ms"]
	res.target("wal latency @1,000/s", "p50 <= 3 ms, p99 <= 10 ms", fmt.Sprintf("p50 %.2f ms, p99 %.2f ms (poll: %.2f, %.2f)", p50, p99, m["wal.latency.poll.p50_ms"], m["wal.latency.poll.p99_ms"]), p50 <= 3 && p99 <= 10)
	b := m["wal.business.wal.tx_per_s"] / m["wal.business.poll.tx_per_s"]
	res.metric("wal.business.wal_vs_poll", b)
	res.target("business tx/s while relaying", ">= 1.25x the polling relay's figure (plain INSERT)", fmt.Sprintf("%.2fx (wal %.2fx, poll %.2fx of no outbox)", b, m["wal.business.wal.ratio"], m["wal.business.poll.ratio"]), b >= 1.25)
	res.note("one run per row, no rounds: on a shared 2-core machine the absolute figures move with the load; compare the rows of one run")
	res.note("the WAL source leaves the rows pending (no UPDATE of dispatched_at): no dead tuples, no index churn, nothing for cleanup to mark; the polling relay writes every event twice")
	return res, nil
}

// on returns a session on another server, sharing s's configuration and
// machine.
func (s *session) on(ctx context.Context, url string) (*session, error) {
	cfg := s.cfg
	cfg.DatabaseURL = url
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	pcfg.MaxConns = 4
	admin, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", pcfg.ConnConfig.Host, err)
	}
	return &session{cfg: cfg, admin: admin, machine: s.machine}, nil
}

// walRelay is one WAL relayer running on an env's outbox, publishing to a
// broker.
type walRelay struct {
	r      *walrelay.Relayer
	cancel context.CancelFunc
	done   chan error
	close  func()
	err    error
	start  time.Time
}

// setupSlot creates the env's publication and slot: events committed from
// now on are in it.
func (e *env) setupSlot(ctx context.Context) (string, error) {
	slot := walrelay.DefaultName(e.tables)
	if err := walrelay.Setup(ctx, e.pool, e.tables, slot, slot); err != nil {
		return "", err
	}
	return slot, nil
}

// teardownSlot drops them, retrying while the server ends the stream that
// read the slot.
func (e *env) teardownSlot(ctx context.Context, slot string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		err := walrelay.Teardown(ctx, e.pool, slot, slot)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startWAL runs one WAL relayer on the env's slot (setupSlot first);
// wrap, if set, wraps its publisher.
func (e *env) startWAL(ctx context.Context, b *broker, prefix string, wrap func(relay.Publisher) relay.Publisher) (*walRelay, error) {
	pool, err := e.newPool(ctx, 4)
	if err != nil {
		return nil, err
	}
	client, err := kafkapub.NewPublisherClient(b.cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	var pub relay.Publisher = kafkapub.NewPublisher(client, kafkapub.PublisherConfig{Source: "wal"})
	if wrap != nil {
		pub = wrap(pub)
	}
	r, err := walrelay.New(walrelay.Config{Pool: pool, Publisher: pub, Tables: e.tables, TopicPrefix: prefix, SkipSetup: true, Logger: e.s.cfg.Logger})
	if err != nil {
		client.Close()
		pool.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	w := &walRelay{r: r, cancel: cancel, done: make(chan error, 1), start: time.Now(),
		close: func() { client.Close(); pool.Close() }}
	go func() { w.done <- r.Run(rctx) }()
	return w, nil
}

// waitFor waits until the relayer published want events and returns the
// time from its start.
func (w *walRelay) waitFor(ctx context.Context, want int64, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for w.r.Stats().Published < want {
		select {
		case err := <-w.done:
			w.done <- err
			return 0, fmt.Errorf("WAL relayer stopped: %v", err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("WAL relayer published %d of %d events within %s", w.r.Stats().Published, want, timeout)
		}
	}
	return time.Since(w.start), nil
}

// waitLeading waits until the relayer reads the slot.
func (w *walRelay) waitLeading(ctx context.Context) error {
	deadline := time.Now().Add(15 * time.Second)
	for !w.r.Stats().Leading {
		if time.Now().After(deadline) {
			return errors.New("WAL relayer did not take the lead within 15s")
		}
		select {
		case err := <-w.done:
			w.done <- err
			return fmt.Errorf("WAL relayer stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// stop cancels the relayer, waits for it and closes its clients. Calling
// it again returns the first call's result.
func (w *walRelay) stop() error {
	if w.close == nil {
		return w.err
	}
	w.cancel()
	select {
	case w.err = <-w.done:
	case <-time.After(45 * time.Second):
		w.err = errors.New("WAL relayer did not stop within 45s")
	}
	w.close()
	w.close = nil
	return w.err
}

// walDrain drains the same preload with the polling relay and the WAL
// source.
func walDrain(ctx context.Context, s *session, e *env, res *Result, n int64) error {
	s.progress("wal: polling relay draining %d events", n)
	poll, err := drainRelay(ctx, s, e, n, s.cfg.Aggregates, 1, nil)
	if err != nil {
		return fmt.Errorf("poll drain: %w", err)
	}
	s.progress("wal: WAL relay draining %d events", n)
	wal, err := drainWAL(ctx, s, e, n)
	if err != nil {
		return fmt.Errorf("wal drain: %w", err)
	}
	t := Table{Title: fmt.Sprintf("drain %s preloaded events", thousands(n)), Columns: []string{"source", "events/s", "seconds", "batches", "records on broker", "vs poll"}}
	for _, r := range []struct {
		key, name string
		d         drainResult
	}{{"poll", "polling relay (claim, publish, UPDATE dispatched_at)", poll}, {"wal", "WAL source (pgoutput slot, no UPDATE)", wal}} {
		t.Rows = append(t.Rows, []string{r.name, rate(r.d.rate()), fmt.Sprintf("%.2f", r.d.elapsed.Seconds()), thousands(r.d.batches), thousands(r.d.published), ratio(r.d.rate() / poll.rate())})
		res.metric("wal.drain."+r.key+".events_per_s", r.d.rate())
		res.metric("wal.drain."+r.key+".published", float64(r.d.published))
	}
	res.metric("wal.drain.ratio", wal.rate()/poll.rate())
	res.Tables = append(res.Tables, t)
	return nil
}

// drainWAL preloads n events after creating the slot and drains them with
// one WAL relayer to a fresh broker.
func drainWAL(ctx context.Context, s *session, e *env, n int64) (d drainResult, err error) {
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()+" RESTART IDENTITY"); err != nil {
		return d, err
	}
	slot, err := e.setupSlot(ctx)
	if err != nil {
		return d, err
	}
	defer func() { err = errors.Join(err, e.teardownSlot(context.WithoutCancel(ctx), slot)) }()
	if err := e.preload(ctx, int(n), s.cfg.Aggregates); err != nil {
		return d, err
	}
	if err := e.vacuum(ctx); err != nil {
		return d, err
	}
	e.checkpoint(ctx)
	b, err := s.startBroker()
	if err != nil {
		return d, err
	}
	defer b.close()
	prefix := fmt.Sprintf("bench%s_%s_", e.id, randomID())
	w, err := e.startWAL(ctx, b, prefix, nil)
	if err != nil {
		return d, err
	}
	elapsed, werr := w.waitFor(ctx, n, drainTimeout(n))
	st := w.r.Stats()
	if err := errors.Join(werr, w.stop()); err != nil {
		return d, err
	}
	d = drainResult{events: st.Published, elapsed: elapsed, batches: st.Batches}
	if d.published, err = b.published(ctx, prefix+"order"); err != nil {
		return d, err
	}
	if d.published < n {
		return d, fmt.Errorf("broker holds %d records; want %d", d.published, n)
	}
	return d, nil
}

// walLatency measures commit-to-ack at 1,000 events/s with each source.
func walLatency(ctx context.Context, s *session, e *env, res *Result, window time.Duration) error {
	r := latencyRun{rate: 1000}
	s.progress("wal: latency at 1,000 events/s, polling relay")
	poll, err := latencyOnce(ctx, s, e, r, window)
	if err != nil {
		return fmt.Errorf("poll latency: %w", err)
	}
	s.progress("wal: latency at 1,000 events/s, WAL relay")
	wal, err := walLatencyOnce(ctx, s, e, r, window)
	if err != nil {
		return fmt.Errorf("wal latency: %w", err)
	}
	t := Table{Title: "commit-to-broker-ack latency at 1,000 events/s", Columns: []string{"source", "achieved ev/s", "events", "p50 ms", "p99 ms", "max ms", "emit tx p50 ms"}}
	for _, x := range []struct {
		key, name string
		st        latencyStats
	}{{"poll", "polling relay (LISTEN/NOTIFY + busy polling)", poll}, {"wal", "WAL source (NOTIFY off)", wal}} {
		p50, p99, mx := percentile(x.st.lat, 50), percentile(x.st.lat, 99), percentile(x.st.lat, 100)
		t.Rows = append(t.Rows, []string{x.name, rate(x.st.achieved), thousands(x.st.events), ms(p50), ms(p99), ms(mx), ms(percentile(x.st.commit, 50))})
		res.metric("wal.latency."+x.key+".p50_ms", float64(p50)/float64(time.Millisecond))
		res.metric("wal.latency."+x.key+".p99_ms", float64(p99)/float64(time.Millisecond))
		res.metric("wal.latency."+x.key+".events", float64(x.st.events))
	}
	res.Tables = append(res.Tables, t)
	return nil
}

// walLatencyOnce is latencyOnce with the WAL source.
func walLatencyOnce(ctx context.Context, s *session, e *env, r latencyRun, window time.Duration) (st latencyStats, err error) {
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()); err != nil {
		return st, err
	}
	slot, err := e.setupSlot(ctx)
	if err != nil {
		return st, err
	}
	defer func() { err = errors.Join(err, e.teardownSlot(context.WithoutCancel(ctx), slot)) }()
	b, err := s.startBroker()
	if err != nil {
		return st, err
	}
	defer b.close()
	prefix := fmt.Sprintf("bench%s_%s_", e.id, randomID())
	// Nothing listens: the WAL source needs no NOTIFY.
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables, TopicPrefix: prefix, DisableNotify: true})
	if err != nil {
		return st, err
	}
	clock := &ackClock{acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
	w, err := e.startWAL(ctx, b, prefix, func(pub relay.Publisher) relay.Publisher { clock.Publisher = pub; return clock })
	if err != nil {
		return st, err
	}
	defer w.stop() //nolint:errcheck // stopped below; a second stop is a no-op
	if err := w.waitLeading(ctx); err != nil {
		return st, err
	}
	st.writers = latencyWriters(s.cfg.Writers, r.rate)
	em, err := emitAtRate(ctx, s, e, p, clock, r, window, st.writers)
	if err != nil {
		return st, err
	}
	if _, err := w.waitFor(ctx, em.events, 30*time.Second); err != nil {
		return st, err
	}
	if err := w.stop(); err != nil {
		return st, err
	}
	st.events = em.events
	st.achieved = perSecond(em.events, em.elapsed)
	if st.lat, err = clock.latencies(); err != nil {
		return st, err
	}
	st.commit = em.commit
	slices.Sort(st.commit)
	return st, nil
}

// bizRun is one row of the business throughput table.
type bizRun struct {
	key, name string
	emit      bool
	relay     string // "", "poll" or "wal"
}

// walBusiness runs the writers for window with no outbox, with the outbox
// and no relay, and with each source relaying at the same time.
func walBusiness(ctx context.Context, s *session, e *env, res *Result, window time.Duration) error {
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables})
	if err != nil {
		return err
	}
	runs := []bizRun{
		{key: "none", name: "orders insert only (no outbox)"},
		{key: "emit", name: "+ Emit, no relay", emit: true},
		{key: "poll", name: "+ Emit, polling relay draining", emit: true, relay: "poll"},
		{key: "wal", name: "+ Emit, WAL relay streaming", emit: true, relay: "wal"},
	}
	t := Table{Title: fmt.Sprintf("business transactions while relaying (%d writers)", s.cfg.Writers),
		Columns: []string{"run", "tx/s", "vs no outbox", "tx p50 ms", "tx p99 ms", "relayed in window", "caught up after"}}
	var base float64
	for _, r := range runs {
		s.progress("wal: business: %s", r.name)
		o, err := bizOnce(ctx, s, e, p, r, window)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		tx := perSecond(o.txs, o.elapsed)
		if r.key == "none" {
			base = tx
		}
		relayed, caught := "-", "-"
		if r.relay != "" {
			relayed = thousands(o.relayed)
			caught = strconv.FormatFloat(o.catchUp.Seconds(), 'f', 2, 64) + " s"
			res.metric("wal.business."+r.key+".relayed", float64(o.relayed))
		}
		t.Rows = append(t.Rows, []string{r.name, rate(tx), ratio(tx / base), ms(percentile(o.lat, 50)), ms(percentile(o.lat, 99)), relayed, caught})
		res.metric("wal.business."+r.key+".tx_per_s", tx)
		res.metric("wal.business."+r.key+".ratio", tx/base)
	}
	res.Tables = append(res.Tables, t)
	return nil
}

type bizOutcome struct {
	txs, relayed int64
	elapsed      time.Duration
	catchUp      time.Duration
	lat          []time.Duration
}

// bizOnce runs one row: fresh tables, the relayer (if any) started and
// caught up with an empty outbox, the writers for window, then the time
// the relayer needs to publish what is left.
func bizOnce(ctx context.Context, s *session, e *env, p *outbox.Producer, r bizRun, window time.Duration) (o bizOutcome, err error) {
	if err := e.exec(ctx, "TRUNCATE orders, "+e.tables.OutboxIdent()); err != nil {
		return o, err
	}
	if err := e.vacuum(ctx); err != nil {
		return o, err
	}
	e.checkpoint(ctx)
	var b *broker
	if r.relay != "" {
		if b, err = s.startBroker(); err != nil {
			return o, err
		}
		defer b.close()
	}
	prefix := fmt.Sprintf("bench%s_%s_", e.id, randomID())
	var relayed func() int64
	var wait func(want int64) (time.Duration, error)
	var stop func() error
	switch r.relay {
	case "poll":
		g, err := e.startRelayers(ctx, b, 1, prefix, false, nil)
		if err != nil {
			return o, err
		}
		defer g.stop() //nolint:errcheck // stopped below; a second stop is a no-op
		relayed, stop = g.dispatched.Load, g.stop
		wait = func(want int64) (time.Duration, error) {
			t0 := time.Now()
			_, err := g.waitFor(ctx, want, drainTimeout(want))
			return time.Since(t0), err
		}
		time.Sleep(300 * time.Millisecond) // the first (empty) poll, and LISTEN
	case "wal":
		// The named result, not a shadow: the slot's teardown error joins it.
		slot, serr := e.setupSlot(ctx)
		if serr != nil {
			return o, serr
		}
		defer func() { err = errors.Join(err, e.teardownSlot(context.WithoutCancel(ctx), slot)) }()
		w, serr := e.startWAL(ctx, b, prefix, nil)
		if serr != nil {
			return o, serr
		}
		defer w.stop() //nolint:errcheck // stopped below; a second stop is a no-op
		if err := w.waitLeading(ctx); err != nil {
			return o, err
		}
		relayed, stop = func() int64 { return w.r.Stats().Published }, w.stop
		wait = func(want int64) (time.Duration, error) {
			t0 := time.Now()
			_, err := w.waitFor(ctx, want, drainTimeout(want))
			return time.Since(t0), err
		}
	}
	fn := emitTx(nil, emitVariant{})
	if r.emit {
		fn = emitTx(p, emitVariant{events: 1})
	}
	o.txs, o.lat, o.elapsed, err = runEmitters(ctx, e, s.cfg.Writers, window, fn)
	if err != nil {
		return o, err
	}
	slices.Sort(o.lat)
	if relayed == nil {
		return o, nil
	}
	o.relayed = relayed()
	if o.catchUp, err = wait(o.txs); err != nil {
		return o, err
	}
	return o, stop()
}
