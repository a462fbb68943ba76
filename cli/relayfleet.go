package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay"
)

// A relay process runs its outboxes as a fleet: the one its flags name,
// or every outbox of its config file, on the same path. Each outbox has
// its own loop (outboxRun.supervise), backoff and lifecycle; what they
// share is what costs the servers: one pgx pool per database connection
// string, sized for the outboxes on it, one LISTEN connection per pool
// (relay.Listener), and one sink client per equal sink settings
// (sinkConns). One outbox whose database is down, whose schema is
// missing or whose rows are held never stops or slows the others: it
// retries on its own, and /readyz and /outboxes say so. A process of one
// outbox exits on that outbox's error instead, as `outbox relay` always
// did: there is nothing else to serve.

// Bounds of the backoff between two starts of an outbox that failed.
const (
	restartMin = time.Second
	restartMax = time.Minute
)

// fleet is a relay process's outboxes and what they share.
type fleet struct {
	log   *slog.Logger
	runs  []*outboxRun
	pools []*fleetPool
	conns *sinkConns
	// multi: more than one outbox, so each is named in logs and labelled
	// in metrics, and one's failure does not end the process.
	multi bool
	scrub scrubber
}

// fleetPool is the pool of one database connection string and the
// LISTEN connection its polling outboxes share.
type fleetPool struct {
	*plannedPool
	pool     *pgxpool.Pool
	listener *relay.Listener
}

// outboxRun is one outbox of the fleet and its state.
type outboxRun struct {
	spec *outboxSpec
	pool *fleetPool
	sink openedSink
	log  *slog.Logger

	mu       sync.Mutex
	state    string // starting, running, retrying, stopped
	since    time.Time
	lastErr  error
	restarts int
	mon      *monitor.Monitor
	src      relay.Source
}

// runFleet relays specs until ctx is cancelled. o is the command's own
// options, for what the process has once: --http and --cpuprofile.
func runFleet(ctx context.Context, g *globals, o *relayOptions, specs []*outboxSpec, log *slog.Logger, scrub scrubber) error {
	httpAddr, profile := o.ops.httpAddr, o.cpuProfile
	fl := &fleet{log: log, conns: newSinkConns(log), multi: len(specs) > 1, scrub: scrub}
	defer fl.close()
	if err := fl.open(ctx, specs); err != nil {
		return err
	}
	if httpAddr != "" {
		addr, err := loopbackDefault(httpAddr)
		if err != nil {
			return err
		}
		bound, stop, err := serveHTTP(addr, fl.handler(), log, "/metrics /healthz /readyz /outboxes")
		if err != nil {
			return err
		}
		o.ops.addr = bound
		defer stop()
	}
	if profile != "" {
		stop, err := startCPUProfile(profile)
		if err != nil {
			return err
		}
		defer stop()
	}
	return fl.run(ctx)
}

// open makes the pools, the listeners and the sinks. Nothing connects
// yet: each outbox does when it starts.
func (fl *fleet) open(ctx context.Context, specs []*outboxSpec) error {
	planned, _ := planSharing(specs)
	for _, p := range planned {
		cfg := p.specs[0].pool.Copy()
		cfg.MaxConns, cfg.MaxConnIdleTime, cfg.HealthCheckPeriod = p.maxConns, poolIdleTime, poolCheckPeriod
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return connectError(err, &cfg.ConnConfig.Config)
		}
		fp := &fleetPool{plannedPool: p, pool: pool}
		var listen []outbox.Tables
		for _, s := range p.specs {
			if s.o.mode != "wal" && !s.o.cfg.PollOnly {
				listen = append(listen, s.tables)
			}
		}
		if len(listen) > 0 {
			fp.listener = relay.NewListener(pool, fl.log.With("database", cfg.ConnConfig.Database), listen...)
		}
		fl.pools = append(fl.pools, fp)
	}
	for _, s := range specs {
		fl.conns.want(s.o.sinkKey())
	}
	for _, s := range specs {
		r := &outboxRun{spec: s, log: fl.log, state: "starting", since: time.Now()}
		if fl.multi {
			r.log = fl.log.With("outbox_name", s.name)
		}
		for _, p := range fl.pools {
			if p.url == s.g.databaseURL {
				r.pool = p
			}
		}
		sink, err := s.o.openSink(ctx, s.flags, r.log, fl.conns)
		if err != nil {
			return fl.outboxError(s, err)
		}
		r.sink = sink
		if err := r.preflight(); err != nil {
			return fl.outboxError(s, err)
		}
		s.o.ops.httpAddr = "" // the fleet serves every outbox's
		s.o.ops.onRun = r.running
		fl.runs = append(fl.runs, r)
	}
	return nil
}

// preflight refuses, before anything connects, a configuration the
// outbox's source would refuse as it starts: in a process of several
// outboxes, that outbox would otherwise retry it for ever.
func (r *outboxRun) preflight() error {
	o := r.spec.o
	common := o.common
	common.Pool, common.Sink, common.Tables = r.pool.pool, r.sink.sink, r.spec.tables
	if o.mode == "wal" {
		cfg := o.wal.cfg
		cfg.Common, cfg.Slot, cfg.Publication = common, o.wal.slot, o.wal.publication
		return cfg.Validate()
	}
	cfg := o.cfg
	cfg.Common = common
	return cfg.Validate()
}

// outboxError is err of outbox s, naming it when the process has more.
func (fl *fleet) outboxError(s *outboxSpec, err error) error {
	if !fl.multi {
		return err
	}
	return fmt.Errorf("outbox %s: %w", s.where(), err)
}

// run runs every outbox until ctx ends (each drains its batch in flight)
// or, with one outbox, until it fails.
func (fl *fleet) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var listeners, outboxes sync.WaitGroup
	lctx, stopListeners := context.WithCancel(context.WithoutCancel(ctx))
	for _, p := range fl.pools {
		if p.listener != nil {
			listeners.Go(func() { p.listener.Run(lctx) })
		}
	}
	errs := make([]error, len(fl.runs))
	for i, r := range fl.runs {
		outboxes.Go(func() {
			if !backoff.Sleep(ctx, fl.startDelay(r)) {
				return
			}
			if errs[i] = r.supervise(ctx, !fl.multi); errs[i] != nil {
				cancel()
			}
		})
	}
	outboxes.Wait()
	// The listeners outlive the relayers, which unsubscribe as they stop.
	stopListeners()
	listeners.Wait()
	return errors.Join(errs...)
}

// startDelay spreads the starts of the outboxes of one pool over a
// second: started together, they would poll, refresh their gauges and
// run their watchdogs in step, each time at once, and the pool would open
// (and the server hold) a connection per outbox for it. The first outbox
// of each pool starts at once, so one outbox alone starts as it always
// did.
func (fl *fleet) startDelay(r *outboxRun) time.Duration {
	specs := r.pool.specs
	k := slices.Index(specs, r.spec)
	return time.Duration(k) * time.Second / time.Duration(len(specs))
}

func (fl *fleet) close() {
	for _, r := range fl.runs {
		r.sink.close()
	}
	for _, p := range fl.pools {
		p.pool.Close()
	}
}

// supervise runs the outbox until ctx ends: it starts it, and after a
// failure starts it again with backoff, unless once (the process's only
// outbox), when it returns the error.
func (r *outboxRun) supervise(ctx context.Context, once bool) error {
	defer r.setState("stopped", nil)
	failures := 0
	for ctx.Err() == nil {
		began := time.Now()
		r.setState("starting", nil)
		err := r.attempt(ctx)
		if once {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("the relayer stopped by itself")
		}
		// A run that lasted starts the backoff over.
		if time.Since(began) > restartMax {
			failures = 0
		}
		failures++
		d := backoff.Delay(restartMin, restartMax, failures)
		r.setState("retrying", err)
		r.log.Error("outbox stopped on an error; the others go on, and it starts again", "err", err, "retry_in", d.Round(time.Millisecond), "attempt", failures)
		if !backoff.Sleep(ctx, d) {
			break
		}
	}
	return nil
}

// attempt connects, checks the sink, and runs the outbox's source with
// its monitor until ctx ends or the source fails.
func (r *outboxRun) attempt(ctx context.Context) error {
	if err := r.connect(ctx); err != nil {
		return err
	}
	if err := r.sink.ping(ctx); err != nil {
		return err
	}
	s, o := r.spec, r.spec.o
	common := o.common
	common.Pool, common.Sink, common.Tables, common.Logger = r.pool.pool, r.sink.sink, s.tables, r.log
	if s.set != nil { // a nil *contracts.Set in the interface would not be nil
		common.Contracts = s.set
		r.log.Info("relay checks events against their contracts", "contracts", s.set.Dir, "types", len(s.set.Types()), "require", s.set.Require)
	}
	if o.mode == "wal" {
		return runWALRelay(ctx, o, common)
	}
	var l *relay.Listener
	if !o.cfg.PollOnly {
		l = r.pool.listener
	}
	return runPollRelay(ctx, o, common, l)
}

// connect checks that the outbox's database answers, with an error that
// says where it tried and what to do.
func (r *outboxRun) connect(ctx context.Context) error {
	cfg := &r.pool.pool.Config().ConnConfig.Config
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.pool.pool.Ping(pctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("stopped while connecting to Postgres: %w", ctx.Err())
		}
		return connectError(err, cfg)
	}
	r.log.Info("connected to Postgres", "host", cfg.Host, "port", cfg.Port, "database", cfg.Database, "user", cfg.User)
	return nil
}

// running records that the outbox's source runs, watched by mon.
func (r *outboxRun) running(mon *monitor.Monitor, src relay.Source) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state, r.since, r.lastErr, r.mon, r.src = "running", time.Now(), nil, mon, src
}

func (r *outboxRun) setState(state string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if state == "retrying" {
		r.restarts++
	}
	r.mon, r.src = nil, nil
	if err != nil {
		r.lastErr = err // kept until the outbox runs again
	}
	r.state, r.since = state, time.Now()
}

// monitor is the outbox's monitor while it runs, else nil.
func (r *outboxRun) monitor() *monitor.Monitor {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mon
}
