package monitor

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/durations"
	"github.com/pgoutbox/outbox/internal/health"
	"github.com/pgoutbox/outbox/ops"
)

// Monitor defaults, applied by WithDefaults (and so by New) and used by `outbox relay`'s flags.
const (
	DefaultRefreshInterval  = 5 * time.Second
	DefaultWatchdogInterval = time.Minute
	DefaultCleanupInterval  = time.Hour
	DefaultCheckTimeout     = 2 * time.Second
)

// Config configures a Monitor. Pool is required, and for the WAL source
// WALFigures.
type Config struct {
	// Pool connects to the outbox database. Required.
	Pool *pgxpool.Pool
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// Source relays the outbox: the polling source's gauges are read from
	// its pending rows, the WAL source's from its slot. Defaults to
	// ops.Polling.
	Source ops.Source
	// WALFigures reads the WAL relayer's counters, for the WAL source
	// (required there; unused for polling, whose relayer feeds Metrics
	// through its hooks).
	WALFigures func() WALFigures
	// Lanes are the WAL relayer's lane counters (exactly-once), when it
	// has them in its Config.Hooks: they are served with the rest. The
	// polling source's Metrics have their own.
	Lanes *LaneMetrics
	// RefreshInterval is how often the gauges are read (one query over
	// the pending rows, or over pg_replication_slots). Defaults to
	// DefaultRefreshInterval (5s).
	RefreshInterval time.Duration
	// WatchdogInterval is how often ops.Check runs and its findings are
	// logged. Defaults to DefaultWatchdogInterval (1m).
	WatchdogInterval time.Duration
	// Watchdog holds the thresholds of those checks (StuckAfter, MaxLag,
	// MaxSlotLagBytes, MaxInactive, with ops' defaults); its Tables and
	// Source are the monitor's, and its Limit is the rows logged per run.
	Watchdog ops.WatchdogConfig
	// CleanupInterval is how often retention cleanup runs (one replica at a
	// time; see ops.Cleanup). The first run is at start. Defaults to
	// DefaultCleanupInterval (1h).
	CleanupInterval time.Duration
	// DisableCleanup turns the cleanup job off, e.g. when cron runs
	// `outbox cleanup`. Defaults to false.
	DisableCleanup bool
	// Cleanup configures the cleanup job; its Tables, Source and Logger are
	// the Monitor's.
	Cleanup ops.CleanupConfig
	// PartitionInterval is how often, for a partitioned outbox, the
	// partitions it needs ahead of its id sequence are made
	// (ops.EnsurePartitions), cleanup or not; the first run is at start.
	// Defaults to DefaultPartitionInterval (10m).
	PartitionInterval time.Duration
	// Checks are readiness checks besides the database ping, e.g. a broker
	// ping. Defaults to none.
	Checks []ReadyCheck
	// CheckTimeout bounds each readiness check. Defaults to
	// DefaultCheckTimeout (2s).
	CheckTimeout time.Duration
	// Logger receives the watchdog's warnings and the jobs' reports.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// WALFigures are a WAL relayer's own counters, which no other replica
// can read from the database.
type WALFigures struct {
	// Published events the broker acknowledged; Parked, those moved to the
	// parked table; Dropped, logical messages that were no event.
	Published, Parked, Dropped int64
	// Batches published, FailedBatches attempts that backed off.
	Batches, FailedBatches int64
	// Heartbeats read back from the slot.
	Heartbeats int64
	// Leading is true while this relayer reads the slot.
	Leading bool
	// Lag is how long ago the oldest transaction read and not yet
	// acknowledged by the broker committed.
	Lag time.Duration
}

// ReadyCheck is one readiness condition of /readyz: a Name, e.g.
// "broker", and a Check func that returns nil when ready, within
// CheckTimeout.
type ReadyCheck = health.Check

// Monitor runs what a relay process runs beside the relayer: Prometheus
// metrics, /healthz and /readyz, the gauges' refresh, the periodic
// watchdog and retention cleanup, for either source. (A polling relayer
// records its own holds in the failures table, where the gauges, the
// watchdog and `outbox events` read them.)
//
//	mon, _ := monitor.New(monitor.Config{Pool: pool, Tables: tables})
//	r, _ := relay.New(relay.Config{Common: relay.Common{Pool: pool, Tables: tables, Sink: pub, Hooks: []relay.Hook{mon.Metrics()}}})
//	go mon.Run(ctx)
//	http.ListenAndServe("127.0.0.1:9090", mon.Handler())
type Monitor struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	metrics *Metrics   // the polling source's
	wal     *walGauges // the WAL source's
	parts   partitionGauges
}

// WithDefaults returns cfg with its zero fields set to their defaults,
// and Watchdog's and Cleanup's Tables and Source (and Cleanup's Logger)
// set to the Monitor's. Negative values are left for Validate to refuse.
func (cfg Config) WithDefaults() Config {
	cfg.Tables = cfg.Tables.WithDefaults()
	durations.Fill(cfg.durations())
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Watchdog.Tables, cfg.Watchdog.Source = cfg.Tables, cfg.Source
	if cfg.Watchdog.Limit == 0 {
		cfg.Watchdog.Limit = maxStuckLogged
	}
	// Check's defaults, applied here so that the gauges use the same
	// thresholds as the watchdog.
	cfg.Watchdog = cfg.Watchdog.WithDefaults()
	cfg.Cleanup.Tables, cfg.Cleanup.Source, cfg.Cleanup.Logger = cfg.Tables, cfg.Source, cfg.Logger
	cfg.Cleanup = cfg.Cleanup.WithDefaults()
	return cfg
}

func (cfg *Config) durations() []durations.Default {
	return []durations.Default{
		{Name: "RefreshInterval", V: &cfg.RefreshInterval, Def: DefaultRefreshInterval},
		{Name: "WatchdogInterval", V: &cfg.WatchdogInterval, Def: DefaultWatchdogInterval},
		{Name: "CleanupInterval", V: &cfg.CleanupInterval, Def: DefaultCleanupInterval},
		{Name: "CheckTimeout", V: &cfg.CheckTimeout, Def: DefaultCheckTimeout},
		{Name: "PartitionInterval", V: &cfg.PartitionInterval, Def: DefaultPartitionInterval},
	}
}

// Validate reports the first field of cfg that a Monitor cannot run
// with, saying what to set instead.
func (cfg Config) Validate() error {
	if cfg.Pool == nil {
		return errors.New("monitor: Config.Pool is nil; pass the outbox database's *pgxpool.Pool")
	}
	if cfg.Source.IsWAL() && cfg.WALFigures == nil {
		return errors.New("monitor: Config.WALFigures is nil; the WAL source's counters come from its relayer (read its Stats and Lag)")
	}
	if err := cfg.Tables.Validate(); err != nil {
		return err
	}
	if err := durations.Check("monitor", cfg.durations()); err != nil {
		return err
	}
	if err := cfg.Watchdog.Validate(); err != nil {
		return err
	}
	if err := cfg.Cleanup.Validate(); err != nil {
		return err
	}
	for _, c := range cfg.Checks {
		if c.Name == "" || c.Check == nil {
			return errors.New("monitor: every readiness check needs a Name and a Check func")
		}
	}
	return nil
}

// New applies cfg's defaults, validates it and registers the metrics.
func New(cfg Config) (*Monitor, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Monitor{cfg: cfg, log: cfg.Logger.With("outbox", cfg.Tables.OutboxIdent())}
	if cfg.Source.IsWAL() {
		m.log = m.log.With("slot", cfg.Source.Slot())
		m.reg = prometheus.NewRegistry()
		m.wal = registerWAL(m.reg, cfg.WALFigures)
		if cfg.Lanes != nil {
			m.reg.MustRegister(cfg.Lanes)
		}
	} else {
		m.metrics = NewMetrics()
		m.reg = m.metrics.Registry()
	}
	return m, nil
}

// Metrics returns the polling source's metrics: pass them to the
// relayer's Config.Hooks. Nil for the WAL source, whose counters are read
// through Config.WALFigures.
func (m *Monitor) Metrics() *Metrics { return m.metrics }

// Registry is where the metrics live; register your own collectors on it
// to serve them on the same endpoint.
func (m *Monitor) Registry() *prometheus.Registry { return m.reg }

// Handler serves /metrics, /healthz (the process answers) and /readyz (the
// database and every readiness check answer within CheckTimeout; 503 with
// the reasons otherwise).
func (m *Monitor) Handler() http.Handler {
	metrics := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
	return health.Handler(metrics, append([]ReadyCheck{{Name: "database", Check: m.cfg.Pool.Ping}}, m.cfg.Checks...), m.cfg.CheckTimeout)
}

// Run runs the periodic jobs until ctx is cancelled. Failures are logged
// and retried at the next tick; Run never gives up.
func (m *Monitor) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { every(ctx, m.cfg.RefreshInterval, m.Refresh) })
	wg.Go(func() { every(ctx, m.cfg.PartitionInterval, m.KeepPartitions) })
	wg.Go(func() {
		if m.cfg.Source.IsWAL() {
			// On an outbox's first start the leader creates the slot a
			// moment after this runs: a missing slot then is not yet a
			// problem.
			m.awaitSlot(ctx, slotSetupGrace)
		}
		var jobs sync.WaitGroup
		jobs.Go(func() { every(ctx, m.cfg.WatchdogInterval, m.watchdog) })
		if !m.cfg.DisableCleanup {
			jobs.Go(func() { every(ctx, m.cfg.CleanupInterval, m.cleanup) })
		}
		jobs.Wait()
	})
	wg.Wait()
}

// Refresh reads the gauges (the pending rows, or the slot); Run calls it
// every RefreshInterval.
func (m *Monitor) Refresh(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, max(m.cfg.RefreshInterval, 5*time.Second))
	defer cancel()
	var err error
	if m.wal != nil {
		err = m.wal.refresh(qctx, m.cfg.Pool, m.cfg.Source.Slot())
	} else {
		var l ops.Lag
		if l, err = ops.ReadLag(qctx, m.cfg.Pool, m.cfg.Tables, m.cfg.Watchdog.StuckAfter); err == nil {
			m.metrics.SetLag(l, m.cfg.Watchdog.MaxLag)
		}
	}
	if err != nil && ctx.Err() == nil {
		m.refreshErrors().Inc()
		m.log.Debug("could not refresh the outbox gauges", "err", err)
	}
}

func (m *Monitor) refreshErrors() prometheus.Counter {
	if m.wal != nil {
		return m.wal.refreshErrors
	}
	return m.metrics.refreshErrors
}

// every runs job at once, then every interval, until ctx is done.
func every(ctx context.Context, interval time.Duration, job func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		job(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// maxStuckLogged bounds the per-row warnings of one watchdog run; the
// count and `outbox watchdog` give the rest.
const maxStuckLogged = 10

func (m *Monitor) watchdog(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rep, err := ops.Check(qctx, m.cfg.Pool, m.cfg.Watchdog)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("watchdog could not read the outbox; will retry", "err", err)
		}
		return
	}
	m.watchPartitions(rep)
	if m.wal != nil {
		for _, p := range rep.Problems {
			m.log.Warn("replication slot unhealthy", "problem", p, "lag_bytes", rep.Slot.LagBytes, "wal_status", rep.Slot.WALStatus)
		}
		return
	}
	m.metrics.SetLag(rep.Lag, m.cfg.Watchdog.MaxLag)
	logPollingReport(m.log, rep)
}

// countPartitions counts what a cleanup of a partitioned outbox made and
// dropped.
func (m *Monitor) countPartitions(res ops.CleanupResult) {
	if res.Partitions == nil {
		return
	}
	m.parts.register(m.reg)
	m.parts.created.Add(float64(len(res.Partitions.Ensure.Created)))
	m.parts.dropped.Add(float64(len(res.Partitions.Dropped)))
}

func logPollingReport(log *slog.Logger, rep ops.Report) {
	if rep.LagBreached {
		log.Warn("outbox lag is over its SLO", "lag", rep.OldestPendingAge.Round(time.Millisecond), "max_lag", rep.MaxLag, "pending", rep.Pending)
	}
	if rep.Lag.Stuck == 0 {
		return
	}
	log.Warn("outbox rows are stuck; run 'outbox watchdog' for the list", "stuck", rep.Lag.Stuck, "stuck_after", rep.StuckAfter)
	for _, s := range rep.Stuck {
		args := []any{"event_id", s.ID, "aggregate_id", s.AggregateID, "type", s.Type, "age", s.Age.Round(time.Second)}
		if s.BlockedBy != 0 {
			args = append(args, "blocked_by", s.BlockedBy)
		}
		if s.LastError != "" {
			args = append(args, "reason", s.Reason, "last_error", s.LastError, "attempts", s.Attempts)
		}
		log.Warn("stuck outbox row", args...)
	}
}

func (m *Monitor) cleanup(ctx context.Context) {
	res, err := ops.Cleanup(ctx, m.cfg.Pool, m.cfg.Cleanup)
	switch {
	case errors.Is(err, ops.ErrCleanupRunning):
		m.log.Debug("cleanup skipped: another replica is running it")
		return
	case err != nil:
		m.countPartitions(res)
		if ctx.Err() == nil {
			m.log.Warn("cleanup failed; will retry at the next interval", "err", err, "deleted", res.Outbox.Deleted)
		}
		return
	}
	args := []any{"outbox_deleted", res.Outbox.Deleted, "outbox_batches", res.Outbox.Batches, "outbox_duration", res.Outbox.Duration.Round(time.Millisecond),
		"processed_deleted", res.Processed.Deleted, "processed_batches", res.Processed.Batches,
		"failures_pruned", res.Failures, "next_in", m.cfg.CleanupInterval}
	if p := res.Partitions; p != nil {
		m.countPartitions(res)
		args = append(args, "partitions_dropped", len(p.Dropped), "partitions_kept", len(p.Kept), "partitions_created", len(p.Ensure.Created))
	}
	if m.wal != nil {
		m.wal.observeCleanup(res)
		args = append(args, "mode", "wal", "wal_horizon", res.WALHorizon)
	} else {
		m.metrics.ObserveCleanup(res)
	}
	m.log.Info("cleanup done", args...)
}
