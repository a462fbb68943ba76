package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// relayOps is what `outbox relay` runs beside the relayer (monitor.Monitor):
// metrics, /healthz and /readyz over --http, the gauges' refresh, the
// periodic watchdog, the recording of publish failures, retention cleanup.
// relay.go calls register, instrument (before relay.New) and start.
type relayOps struct {
	httpAddr           string
	cfg                monitor.Config
	cleanupInterval    time.Duration
	processedRetention time.Duration
	allowShort         bool

	mon *monitor.Monitor
	// addr is where the HTTP server listens, once started.
	addr net.Addr
	// onRun, when set, is told of the monitor and the source as each
	// relayer starts running: a process serving several outboxes
	// serves their metrics and state itself (relayhttp.go).
	onRun func(mon *monitor.Monitor, src relay.Source)
}

// running tells onRun that src runs, watched by o.mon.
func (o *relayOps) running(src relay.Source) {
	if o.onRun != nil {
		o.onRun(o.mon, src)
	}
}

func (o *relayOps) register(f *pflag.FlagSet) {
	f.StringVar(&o.httpAddr, "http", "", "serve /metrics, /healthz, /readyz and /outboxes on host:port (a bare :port binds 127.0.0.1); off when empty")
	durationVar(f, &o.cfg.RefreshInterval, "metrics-refresh", monitor.DefaultRefreshInterval, "how often the pending, lag and stuck gauges are read from the database")
	durationVar(f, &o.cfg.Watchdog.StuckAfter, "stuck-after", ops.DefaultStuckAfter, "rows pending longer than this are stuck (watchdog and outbox_stuck_events)")
	durationVar(f, &o.cfg.Watchdog.MaxLag, "max-lag", ops.DefaultMaxLag, "lag SLO: a warning and outbox_lag_slo_breached when the oldest pending row is older")
	durationVar(f, &o.cfg.WatchdogInterval, "watchdog-interval", monitor.DefaultWatchdogInterval, "how often stuck rows and the lag SLO are checked and logged")
	durationVar(f, &o.cleanupInterval, "cleanup-interval", monitor.DefaultCleanupInterval, "how often retention cleanup runs (one replica at a time); 0 disables it")
	durationVar(f, &o.cfg.Cleanup.Retention, "retention", ops.DefaultRetention, "cleanup deletes dispatched rows older than this")
	durationVar(f, &o.processedRetention, "processed-retention", ops.DefaultProcessedRetention, "cleanup deletes processed_events rows older than this (longer than any redelivery window); 0 leaves the table alone")
	f.IntVar(&o.cfg.Cleanup.BatchSize, "cleanup-batch-size", ops.DefaultCleanupBatch, "rows per cleanup delete statement (as 'outbox cleanup --batch-size')")
	deprecatedAlias(f, "cleanup-batch-size", "cleanup-batch")
	durationVar(f, &o.cfg.Cleanup.Pause, "cleanup-pause", ops.DefaultCleanupPause, "pause between cleanup batches")
	durationVar(f, &o.cfg.PartitionInterval, "partition-interval", monitor.DefaultPartitionInterval, "a partitioned outbox: how often the partitions needed ahead of the id sequence are made, cleanup or not (the role must own the table)")
	f.BoolVar(&o.allowShort, allowShortRetentionFlag, false, "allow a --retention or --processed-retention under "+formatDays(minRetention))
}

// instrument checks the flags, builds the monitor and adds its metrics to
// cfg.Hooks. cfg.Pool, Tables and Logger must be set; /readyz asks
// cfg.Sink's Ready, when it has one.
func (o *relayOps) instrument(cfg *relay.Config) error {
	if err := o.check(); err != nil {
		return err
	}
	mc := o.cfg
	mc.Pool, mc.Tables, mc.Logger = cfg.Pool, cfg.Tables, cfg.Logger
	mc.CleanupInterval = o.cleanupInterval
	mc.DisableCleanup = o.cleanupInterval == 0
	mc.Cleanup.ProcessedRetention = o.processedRetention
	mc.Cleanup.SkipProcessed = o.processedRetention == 0
	mc.Checks = append(mc.Checks, brokerChecks(cfg.Sink)...)
	mon, err := monitor.New(mc)
	if err != nil {
		return err
	}
	cfg.Hooks = append(cfg.Hooks, mon.Metrics())
	o.mon = mon
	return nil
}

// brokerChecks are /readyz's broker condition: the sink's Ready, when it
// is a relay.Readier (kafkapub's fails while publishing fails, not only
// while the broker does not answer: a broker can answer metadata requests
// and refuse every record); none for a sink that cannot tell.
func brokerChecks(sink relay.Sink) []monitor.ReadyCheck {
	if r, ok := sink.(relay.Readier); ok {
		return []monitor.ReadyCheck{{Name: "broker", Check: r.Ready}}
	}
	return nil
}

// check checks the flags shared by both modes and settles --http's
// address.
func (o *relayOps) check() error {
	if o.httpAddr != "" {
		addr, err := loopbackDefault(o.httpAddr)
		if err != nil {
			return err
		}
		o.httpAddr = addr
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--metrics-refresh", o.cfg.RefreshInterval}, {"--stuck-after", o.cfg.Watchdog.StuckAfter}, {"--max-lag", o.cfg.Watchdog.MaxLag},
		{"--watchdog-interval", o.cfg.WatchdogInterval}, {"--retention", o.cfg.Cleanup.Retention}, {"--cleanup-pause", o.cfg.Cleanup.Pause},
		{"--partition-interval", o.cfg.PartitionInterval},
	} {
		if d.v <= 0 {
			return fmt.Errorf("%s %s: use a positive duration", d.flag, formatDays(d.v))
		}
	}
	if o.cleanupInterval < 0 || o.processedRetention < 0 {
		return fmt.Errorf("--cleanup-interval (%s) and --processed-retention (%s) must be positive, or 0 to turn them off", o.cleanupInterval, o.processedRetention)
	}
	return nil
}

// startWAL is instrument and start for --mode wal: a monitor.Monitor of
// the WAL source over r serves the slot's metrics, /healthz and /readyz with --http,
// and runs the slot watchdog and WAL-mode cleanup (rows older than
// --retention whose commit the slot has confirmed). --stuck-after and
// --max-lag, which read pending rows, do not apply.
func (o *relayOps) startWAL(ctx context.Context, r *walrelay.Relayer, lanes *monitor.LaneMetrics, wd ops.WatchdogConfig) (stop func(), err error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	rc := r.Config()
	cleanup := o.cfg.Cleanup
	cleanup.ProcessedRetention = o.processedRetention
	cleanup.SkipProcessed = o.processedRetention == 0
	mc := monitor.Config{
		Pool: rc.Pool, Tables: rc.Tables, Source: ops.WAL(rc.Slot), WALFigures: walFigures(r), Logger: rc.Logger,
		RefreshInterval: o.cfg.RefreshInterval, WatchdogInterval: o.cfg.WatchdogInterval, Watchdog: wd,
		CleanupInterval: o.cleanupInterval, DisableCleanup: o.cleanupInterval == 0, Cleanup: cleanup,
		PartitionInterval: o.cfg.PartitionInterval, Lanes: lanes,
	}
	mc.Checks = append(mc.Checks, brokerChecks(rc.Sink)...)
	mon, err := monitor.New(mc)
	if err != nil {
		return nil, err
	}
	o.mon = mon
	stopHTTP := func() {}
	if o.httpAddr != "" {
		o.addr, stopHTTP, err = serveHTTP(o.httpAddr, mon.Handler(), rc.Logger, "/metrics /healthz /readyz")
		if err != nil {
			return nil, err
		}
	}
	jobs, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { mon.Run(jobs) })
	return func() {
		cancel()
		stopHTTP()
		wg.Wait()
	}, nil
}

// walFigures reads the WAL relayer's counters for its monitor.
func walFigures(r *walrelay.Relayer) func() monitor.WALFigures {
	return func() monitor.WALFigures {
		s := r.Stats()
		return monitor.WALFigures{Published: s.Dispatched, Parked: s.Parked, Dropped: s.Dropped, Batches: s.Batches,
			FailedBatches: s.FailedBatches, Heartbeats: s.Heartbeats, Leading: s.Leading, Lag: r.Lag()}
	}
}

// start starts the periodic jobs and, with --http, the HTTP server. stop ends them; call it after the relayer stopped, so
// that /metrics answers until the end.
func (o *relayOps) start(ctx context.Context, r *relay.Relayer) (stop func(), err error) {
	log := r.Config().Logger
	stopHTTP := func() {}
	if o.httpAddr != "" {
		o.addr, stopHTTP, err = serveHTTP(o.httpAddr, o.mon.Handler(), log, "/metrics /healthz /readyz")
		if err != nil {
			return nil, err
		}
	}
	jobs, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { o.mon.Run(jobs) })
	return func() {
		cancel()
		stopHTTP()
		wg.Wait()
	}, nil
}

// serveHTTP serves h on addr (checked by loopbackDefault) for --http of
// relay and consume, and logs where; paths lists what h serves, for that
// log line. stop shuts the server down, waiting up to 5s for requests in
// flight.
func serveHTTP(addr string, h http.Handler, log *slog.Logger, paths string) (bound net.Addr, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot serve --http on %s: %w (is another process using the port? pick another)", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics and health server stopped", "err", err)
		}
	}()
	log.Info("serving metrics and health checks", "addr", ln.Addr().String(), "paths", paths)
	return ln.Addr(), func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}

// loopbackDefault checks a host:port and binds a bare :port to 127.0.0.1:
// metrics are served to the local scraper unless an address is given on
// purpose.
func loopbackDefault(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--http %q: write it as host:port, e.g. 127.0.0.1:9090", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("--http %q: %q is not a port number", addr, port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}
