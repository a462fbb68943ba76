package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// runWAL compares the polling relay with the WAL source on one
// wal_level=logical server, in one run: drain throughput against
// pg_recvlogical's, commit-to-ack latency, and what relaying costs the
// business transactions in each emit mode.
func runWAL(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	url, server, stop, err := s.logicalServer(ctx, "wal")
	if err != nil {
		return nil, err
	}
	defer stop()
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
	recv, recvErr := findRecvlogical()

	n := int64(cfg.Events)
	latWindow := pick(cfg.Short, 500*time.Millisecond, 10*time.Second)
	bizWindow, bizRounds := pick(cfg.Short, 300*time.Millisecond, 4*time.Second), pick(cfg.Short, 1, 3)
	res := &Result{}
	var version string
	if err := ws.admin.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return nil, err
	}
	res.param("server", "%s, Postgres %s, wal_level=logical, fsync=%s, synchronous_commit=%s, autovacuum=%s; the same server, schema and dev broker for every row",
		server, version, setting(ctx, e, "fsync"), setting(ctx, e, "synchronous_commit"), setting(ctx, e, "autovacuum"))
	res.param("poll", "relay.New with defaults (batch 5,000, LISTEN/NOTIFY, busy polling), 1 relayer, in this process")
	res.param("wal", "walrelay.New with defaults (batch 5,000, pgoutput proto_version 1, messages, status update every 1s, linger %s), in this process; slot and publication created before the events and dropped after each row", walrelay.DefaultLinger)
	if recvErr == nil {
		res.param("pg_recvlogical", "%s %s, output to /dev/null: the same slot options as the relayer, the least a reader of the slot costs the server and the most it can read", recv, strings.Join(recvlogicalArgs("<slot>", "<publication>", ""), " "))
	} else {
		res.param("pg_recvlogical", "not run: %v", recvErr)
		res.note("pg_recvlogical was not found (%v): its rows and the targets measured against it say 'not run'", recvErr)
	}
	res.param("drain", "%s events over %s aggregates, preloaded in one INSERT, and again as transactions of 100, after creating the slots, then VACUUM ANALYZE; pg_recvlogical reads its own slot up to the WAL position after the preload (--endpos), timed from its start to its exit; the WAL relayer then reads its slot, timed from its start to the last event's broker ack (taking the lead and starting the stream included); the polling relay then drains the table, timed from its start to the commit of its last batch; CHECKPOINT before each; CPU seconds, which move less with the machine's load than wall time: the walsender's user + system time from /proc (a server on this machine), and the reader's: pg_recvlogical's, or this process's over the drain (relayer + in-process dev broker)", thousands(n), thousands(int64(cfg.Aggregates)))
	res.param("latency", "one event per transaction at 1,000/s for %s by %d writers; commit returned to broker ack", latWindow, latencyWriters(cfg.Writers, 1000))
	res.param("business", "%d writers for %s per row and round, %d rounds with the rows interleaved (every other round in reverse order), the median round of each row reported (its every column): BEGIN; INSERT INTO orders; Emit; COMMIT (the producer configuration the row names), tables truncated, VACUUM and CHECKPOINT before each row, autovacuum as the server has it during the window; "+
		"WAL B/event is the pg_current_wal_lsn() delta from the writers' start until the reader has taken in every event (the writers' end without one), over the events committed, so it includes the orders insert, the commit record and the relayers' own writes (the polling relay's UPDATEs); "+
		"dead tuples is the outbox's n_dead_tup then, after each session reported its statistics (pg_stat_force_next_flush); "+
		"cleanup removes the relayed rows as a deployment would: ops.Cleanup (batches of %s, WAL mode once the slot confirmed them; pauses left out), then VACUUM of the outbox, with autovacuum off on it meanwhile; "+
		"whole life = window + cleanup: insert (+ the polling relay's UPDATE) + delete + vacuum, or the WAL-only modes' own writes; "+
		"caught up after: from the writers' end until the polling/WAL relay has published every event (broker ack), or until pg_recvlogical's walsender has sent the WAL up to the writers' end (pg_stat_replication.sent_lsn); "+
		"events/batch: the relayer's publish calls over the window and catch-up; process CPU: this process's user + system time over the same span (the writers' client side, plus the relayer and dev broker when the row has them) per committed tx; walsender CPU: the slot reader's walsender's, from /proc, per event",
		cfg.Writers, bizWindow, bizRounds, thousands(ops.DefaultCleanupBatch))

	parts := cfg.WALParts
	if slices.Contains(parts, "drain") {
		if err := walDrain(ctx, ws, e, res, n, recv, recvErr); err != nil {
			return res, err
		}
		walDrainTargets(res, recvErr)
	}
	if slices.Contains(parts, "latency") {
		if err := walLatency(ctx, ws, e, res, latWindow); err != nil {
			return res, err
		}
		walLatencyTarget(res)
	}
	if slices.Contains(parts, "business") {
		if err := walBusiness(ctx, ws, e, res, bizWindow, bizRounds, recv, recvErr); err != nil {
			return res, err
		}
		walBusinessTargets(res, recvErr)
	}
	res.note("the drains run once each; the business rows run in interleaved rounds: on a shared 2-core machine the absolute figures move with the load; compare the rows of one run")
	res.note("the relayers, the dev broker and the writers share this process (GOMAXPROCS %d); pg_recvlogical is a process of its own whose reading costs next to nothing, so 'vs pg_recvlogical' charges the relayer and its broker client with their CPU", runtime.GOMAXPROCS(0))
	res.note("the WAL source leaves ModeInsert rows pending (no UPDATE of dispatched_at): no dead tuples from relaying, no index churn; cleanup deletes them once the slot confirmed them. The polling relay writes every event twice, and its UPDATE leaves a dead tuple per event")
	return res, nil
}

// walDrainTargets judges the drain part's targets on the run's metrics.
func walDrainTargets(res *Result, recvErr error) {
	m := res.Metrics
	for _, bl := range walBacklogs(0) {
		key, name := "wal.drain.", "wal drain, one-INSERT backlog"
		if bl.key != "" {
			key, name = "wal.drain."+bl.key+".", "wal drain, backlog of 100-event transactions"
		}
		d := m[key+"ratio"]
		measured := fmt.Sprintf("%.2fx (%s vs %s events/s)", d, rate(m[key+"wal.events_per_s"]), rate(m[key+"poll.events_per_s"]))
		if recvErr == nil {
			measured += fmt.Sprintf("; pg_recvlogical %s events/s = %.2fx poll (the decoding limit); the WAL relay reaches %.2fx of it",
				rate(m[key+"recvlogical.events_per_s"]), m[key+"recvlogical.events_per_s"]/m[key+"poll.events_per_s"], m[key+"wal_vs_recvlogical"])
		}
		res.target(name, ">= 1.5x the polling relay of the same run", measured, d >= 1.5)
	}
}

// walLatencyTarget judges the latency part's target.
func walLatencyTarget(res *Result) {
	m := res.Metrics
	p50, p99 := m["wal.latency.wal.p50_ms"], m["wal.latency.wal.p99_ms"]
	res.target("wal latency @1,000/s", "p50 <= 3 ms, p99 <= 10 ms", fmt.Sprintf("p50 %.2f ms, p99 %.2f ms (poll: %.2f, %.2f)", p50, p99, m["wal.latency.poll.p50_ms"], m["wal.latency.poll.p99_ms"]), p50 <= 3 && p99 <= 10)

}

// walBusinessTargets judges the business part's targets.
func walBusinessTargets(res *Result, recvErr error) {
	m := res.Metrics
	notRun := func(name, goal string) {
		res.target(name, goal, fmt.Sprintf("not measured: pg_recvlogical not run (%v)", recvErr), false)
	}
	poll := m["wal.business.poll.tx_per_s"]
	best, bestMode := 0.0, ""
	var others []string
	for _, md := range walModes() {
		tx := m["wal.business."+md.key+".wal.tx_per_s"]
		others = append(others, fmt.Sprintf("%s %.2fx", md.key, tx/poll))
		if tx > best {
			best, bestMode = tx, md.key
		}
		name, goal := "business tx/s, WAL relay vs pg_recvlogical: "+md.key, ">= 0.9x pg_recvlogical reading the slot, same mode, same run"
		if recvErr != nil {
			notRun(name, goal)
			continue
		}
		r := m["wal.business."+md.key+".wal.vs_recvlogical"]
		res.target(name, goal, fmt.Sprintf("%.2fx (%s vs %s tx/s; no slot: %s)", r, rate(tx), rate(m["wal.business."+md.key+".recvlogical.tx_per_s"]), rate(m["wal.business."+md.key+".none.tx_per_s"])), r >= 0.9)
	}
	b := best / poll
	res.metric("wal.business.wal_vs_poll", m["wal.business.wal.tx_per_s"]/poll)
	res.metric("wal.business.best_vs_poll", b)
	res.target("business tx/s, WAL relay vs polling relay", ">= 1.25x the polling relay's figure, best mode",
		fmt.Sprintf("%.2fx (%s: %s vs %s tx/s; %s)", b, bestMode, rate(best), rate(poll), strings.Join(others, ", ")), b >= 1.25)

	// The outbox's own WAL: the row's whole-life bytes per event less the
	// orders insert and commit a business transaction writes without it.
	base := m["wal.business.none.wal_bytes_per_event"]
	pollLife := m["wal.business.poll.wal_bytes_per_event_life"]
	for _, md := range walModes() {
		life := m["wal.business."+md.key+".wal.wal_bytes_per_event_life"]
		r := (life - base) / (pollLife - base)
		res.metric("wal.wal_bytes."+md.key+".ratio", r)
		res.metric("wal.wal_bytes."+md.key+".per_tx_ratio", life/pollLife)
		res.target("WAL bytes per event: "+md.key, "<= 0.6x polling (insert + UPDATE + cleanup delete + vacuum)",
			fmt.Sprintf("%.2fx (the outbox's share: %.0f vs %.0f B/event; per business tx with its orders insert: %.0f vs %.0f B = %.2fx)", r, life-base, pollLife-base, life, pollLife, life/pollLife), r <= 0.6)
	}
}

// logicalServer is the server with wal_level=logical the WAL measurements
// run on: --wal-database-url, or a throwaway cluster, which stop removes.
// desc says which, for the parameters.
func (s *session) logicalServer(ctx context.Context, scenario string) (url, desc string, stop func(), err error) {
	return s.logicalServerWith(ctx, scenario, nil)
}

// logicalServerWith is logicalServer; a throwaway cluster also gets the
// settings extra.
func (s *session) logicalServerWith(ctx context.Context, scenario string, extra map[string]string) (url, desc string, stop func(), err error) {
	if s.cfg.WALDatabaseURL != "" {
		return s.cfg.WALDatabaseURL, "--wal-database-url", func() {}, nil
	}
	s.progress("%s: starting a throwaway wal_level=logical cluster", scenario)
	settings := map[string]string{"max_connections": "150", "max_slot_wal_keep_size": "4GB"}
	for k, v := range extra {
		settings[k] = v
	}
	c, err := tmppg.Logical(ctx, 10, settings)
	if err != nil {
		return "", "", nil, fmt.Errorf("the %s scenario needs a server with wal_level=logical; starting a throwaway one failed (set --wal-database-url to a server with wal_level=logical and a role with REPLICATION): %w", scenario, err)
	}
	return c.URL(), "throwaway cluster (internal/tmppg)", func() {
		if err := c.Stop(); err != nil {
			s.progress("%s: %v", scenario, err)
		}
	}, nil
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
// now on are in it. Rows an earlier run left pending are no loss here: a
// run measures only what it writes once the slot exists.
func (e *env) setupSlot(ctx context.Context) (string, error) {
	slot := walrelay.DefaultNameOf(e.pool, e.tables)
	if err := walrelay.SetupAllowPending(ctx, e.pool, e.tables, slot, slot); err != nil {
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
// linger is its Config.Linger (0: the default).
func (e *env) startWAL(ctx context.Context, b *broker, prefix string, linger time.Duration, wrap func(relay.Sink) relay.Sink) (*walRelay, error) {
	return e.startWALWith(ctx, b, prefix, linger, wrap, false)
}

// startWALWith is startWAL; messages turns on message-mode events
// (walrelay.Config.Messages), first revoking pg_logical_emit_message from
// PUBLIC (walrelay.SecureMessages), which that takes.
func (e *env) startWALWith(ctx context.Context, b *broker, prefix string, linger time.Duration, wrap func(relay.Sink) relay.Sink, messages bool) (*walRelay, error) {
	if messages {
		if _, err := walrelay.SecureMessages(ctx, e.pool); err != nil {
			return nil, err
		}
	}
	pool, err := e.newPool(ctx, 4)
	if err != nil {
		return nil, err
	}
	client, err := kafkapub.NewPublisherClient(b.cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	var pub relay.Sink = kafkapub.NewPublisher(client, kafkapub.PublisherConfig{Source: "wal"})
	if wrap != nil {
		pub = wrap(pub)
	}
	r, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: pool, Sink: pub, Tables: e.tables, TopicPrefix: prefix, Logger: e.s.cfg.Logger}, SkipSetup: true, Linger: linger, Messages: messages})
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
	for w.r.Stats().Dispatched < want {
		select {
		case err := <-w.done:
			w.done <- err
			return 0, fmt.Errorf("WAL relayer stopped: %v", err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("WAL relayer published %d of %d events within %s", w.r.Stats().Dispatched, want, timeout)
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

// walLatency measures commit-to-ack at 1,000 events/s with each source.
func walLatency(ctx context.Context, s *session, e *env, res *Result, window time.Duration) error {
	r := latencyRun{rate: 1000}
	s.progress("wal: latency at 1,000 events/s, polling relay")
	poll, err := latencyOnce(ctx, s, e, r, window)
	if err != nil {
		return fmt.Errorf("poll latency: %w", err)
	}
	s.progress("wal: latency at 1,000 events/s, WAL relay")
	wal, err := walLatencyOnce(ctx, s, e, r, window, 0)
	if err != nil {
		return fmt.Errorf("wal latency: %w", err)
	}
	s.progress("wal: latency at 1,000 events/s, WAL relay, linger off")
	walNow, err := walLatencyOnce(ctx, s, e, r, window, -1)
	if err != nil {
		return fmt.Errorf("wal latency, linger off: %w", err)
	}
	t := Table{Title: "commit-to-broker-ack latency at 1,000 events/s", Columns: []string{"source", "achieved ev/s", "events", "p50 ms", "p99 ms", "max ms", "emit tx p50 ms"}}
	for _, x := range []struct {
		key, name string
		st        latencyStats
	}{{"poll", "polling relay (LISTEN/NOTIFY + busy polling)", poll},
		{"wal", fmt.Sprintf("WAL source (NOTIFY off; linger %s, the default)", walrelay.DefaultLinger), wal},
		{"wal_no_linger", "WAL source, linger off", walNow}} {
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
func walLatencyOnce(ctx context.Context, s *session, e *env, r latencyRun, window, linger time.Duration) (st latencyStats, err error) {
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
	w, err := e.startWAL(ctx, b, prefix, linger, func(pub relay.Sink) relay.Sink { clock.Sink = pub; return clock })
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
