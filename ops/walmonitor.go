package ops

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// WALSource is what a WALMonitor reads from the relayer; a
// *walrelay.Relayer has it.
type WALSource interface {
	Stats() walrelay.Stats
	Lag() time.Duration
}

// WALMonitorConfig configures a WALMonitor. Pool, Relayer and Slot are
// required.
type WALMonitorConfig struct {
	// Pool connects to the outbox database. Required.
	Pool *pgxpool.Pool
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// Slot is the relayer's replication slot. Required.
	Slot string
	// Relayer gives the counters and the lag in time. Required.
	Relayer WALSource
	// RefreshInterval is how often the slot gauges are read from
	// pg_replication_slots. Defaults to DefaultRefreshInterval (5s).
	RefreshInterval time.Duration
	// WatchdogInterval is how often the slot is checked (CheckWAL) and
	// problems logged. Defaults to DefaultWatchdogInterval (1m).
	WatchdogInterval time.Duration
	// Watchdog configures those checks; its Slot is the monitor's.
	Watchdog WALWatchdogConfig
	// CleanupInterval, DisableCleanup and Cleanup: as in MonitorConfig;
	// Cleanup.WALSlot is set to Slot. Defaults: hourly, on.
	CleanupInterval time.Duration
	DisableCleanup  bool
	Cleanup         CleanupConfig
	// Checks are readiness checks besides the database ping. Defaults to
	// none.
	Checks []ReadyCheck
	// CheckTimeout bounds each readiness check. Defaults to
	// DefaultCheckTimeout (2s).
	CheckTimeout time.Duration
	// Logger receives the jobs' reports. Defaults to slog.Default().
	Logger *slog.Logger
}

// WALMonitor is Monitor for a WAL relayer (`outbox relay --mode wal`):
// metrics (the relayer's counters and the slot's state, which every
// replica reads from pg_replication_slots, so each reports it), /healthz
// and /readyz, the slot watchdog and WAL-mode retention cleanup.
//
//	r, _ := walrelay.New(walrelay.Config{Common: relay.Common{Pool: pool, Sink: pub}})
//	mon, _ := ops.NewWALMonitor(ops.WALMonitorConfig{Pool: pool, Slot: r.Config().Slot, Relayer: r})
//	go mon.Run(ctx)
//	http.ListenAndServe("127.0.0.1:9464", mon.Handler())
type WALMonitor struct {
	cfg WALMonitorConfig
	log *slog.Logger
	reg *prometheus.Registry

	lagBytes, active prometheus.Gauge
	walStatus        *prometheus.GaugeVec
	cleanupDeleted   *prometheus.CounterVec
	cleanupLast      prometheus.Gauge
	refreshFailures  prometheus.Counter
}

// walStatuses are the label values of outbox_wal_slot_wal_status: the
// slot's wal_status, or missing.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost", "missing"}

// NewWALMonitor validates cfg, applies its defaults and registers the
// metrics.
func NewWALMonitor(cfg WALMonitorConfig) (*WALMonitor, error) {
	if cfg.Pool == nil || cfg.Relayer == nil || cfg.Slot == "" {
		return nil, errors.New("ops: WALMonitorConfig needs Pool, Relayer and Slot")
	}
	if err := cfg.Tables.Validate(); err != nil {
		return nil, err
	}
	cfg.Tables = cfg.Tables.WithDefaults()
	if err := applyDurationDefaults("WAL monitor", []durationDefault{
		{"RefreshInterval", &cfg.RefreshInterval, DefaultRefreshInterval},
		{"WatchdogInterval", &cfg.WatchdogInterval, DefaultWatchdogInterval},
		{"CleanupInterval", &cfg.CleanupInterval, DefaultCleanupInterval},
		{"CheckTimeout", &cfg.CheckTimeout, DefaultCheckTimeout},
	}); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Watchdog.Slot = cfg.Slot
	cfg.Cleanup.Tables, cfg.Cleanup.Logger, cfg.Cleanup.WALSlot = cfg.Tables, cfg.Logger, cfg.Slot
	if _, err := cfg.Cleanup.withDefaults(); err != nil {
		return nil, err
	}
	for _, c := range cfg.Checks {
		if c.Name == "" || c.Check == nil {
			return nil, errors.New("ops: every readiness check needs a Name and a Check func")
		}
	}
	m := &WALMonitor{cfg: cfg, log: cfg.Logger.With("outbox", cfg.Tables.OutboxIdent(), "slot", cfg.Slot), reg: prometheus.NewRegistry()}
	m.register()
	return m, nil
}

func (m *WALMonitor) register() {
	reg, r := m.reg, m.cfg.Relayer
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	counter := func(name, help string, v func(walrelay.Stats) int64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(r.Stats())) }))
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		reg.MustRegister(g)
		return g
	}
	// The same name as the polling relay's, without its topic label: the
	// WAL relayer counts events, not topics.
	counter("outbox_events_dispatched_total", "Events the broker acknowledged (WAL source: all topics; duplicates re-sent after a restart included).", func(s walrelay.Stats) int64 { return s.Dispatched })
	counter("outbox_batches_total", "Batches this relayer published.", func(s walrelay.Stats) int64 { return s.Batches })
	counter("outbox_failed_batches_total", "Attempts that failed and backed off (broker or database unreachable, leader session lost).", func(s walrelay.Stats) int64 { return s.FailedBatches })
	counter("outbox_wal_parked_total", "Events the broker refused for good or the relayer could not decode, moved to the parked table (the stream went on without them).", func(s walrelay.Stats) int64 { return s.Parked })
	counter("outbox_wal_heartbeats_total", "Heartbeat messages read back from the slot while leading.", func(s walrelay.Stats) int64 { return s.Heartbeats })
	counter("outbox_wal_dropped_total", "Logical messages with the outbox's prefix that were no event: logged, not published.", func(s walrelay.Stats) int64 { return s.Dropped })
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_wal_leader", Help: "1 while this relayer is the slot's reader (the leader), else 0."},
		func() float64 {
			if r.Stats().Leading {
				return 1
			}
			return 0
		}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_wal_slot_lag_seconds", Help: "How long ago the oldest transaction read and not yet acknowledged by the broker committed; 0 when all is acknowledged, and on standbys (take max over replicas)."},
		func() float64 { return r.Lag().Seconds() }))
	m.lagBytes = gauge("outbox_wal_slot_lag_bytes", "WAL written since the slot's confirmed position (pg_current_wal_lsn() - confirmed_flush_lsn): kept on the server's disk for the slot. Read from pg_replication_slots by every replica.")
	m.active = gauge("outbox_wal_slot_active", "1 while a process streams from the slot, else 0.")
	m.walStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_wal_slot_wal_status", Help: "1 for the slot's wal_status (reserved, extended, unreserved: past max_slot_wal_keep_size, lost: invalidated), or missing when the slot does not exist; 0 for the others."}, []string{"status"})
	reg.MustRegister(m.walStatus)
	m.refreshFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_stats_refresh_errors_total", Help: "Failed reads of the slot gauges; while they fail the gauges keep their last value."})
	reg.MustRegister(m.refreshFailures)
	m.cleanupDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_cleanup_deleted_rows_total", Help: "Rows deleted by retention cleanup, by table (outbox, processed)."}, []string{"table"})
	reg.MustRegister(m.cleanupDeleted)
	m.cleanupLast = gauge("outbox_cleanup_last_success_timestamp_seconds", "Unix time of the last cleanup this process completed.")
}

// Registry is where the metrics live.
func (m *WALMonitor) Registry() *prometheus.Registry { return m.reg }

// Handler serves /metrics, /healthz and /readyz, as Monitor.Handler.
func (m *WALMonitor) Handler() http.Handler {
	return opsHandler(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}), m.cfg.Pool.Ping, m.cfg.Checks, m.cfg.CheckTimeout)
}

// Run runs the refresh, watchdog and cleanup jobs until ctx is cancelled.
func (m *WALMonitor) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { every(ctx, m.cfg.RefreshInterval, m.Refresh) })
	wg.Go(func() {
		// On an outbox's first start the leader creates the slot a moment
		// after this runs: a missing slot then is not yet a problem.
		m.awaitSlot(ctx, slotSetupGrace)
		var jobs sync.WaitGroup
		jobs.Go(func() { every(ctx, m.cfg.WatchdogInterval, m.watchdog) })
		if !m.cfg.DisableCleanup {
			jobs.Go(func() { every(ctx, m.cfg.CleanupInterval, m.cleanup) })
		}
		jobs.Wait()
	})
	wg.Wait()
}

// slotSetupGrace is how long the watchdog and cleanup jobs wait for the
// slot to appear before they report it missing.
const slotSetupGrace = 30 * time.Second

// awaitSlot returns once the slot exists, grace has passed or ctx is done.
func (m *WALMonitor) awaitSlot(ctx context.Context, grace time.Duration) {
	deadline := time.Now().Add(grace)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, found, err := ReadWALSlot(qctx, m.cfg.Pool, m.cfg.Slot)
		cancel()
		if err == nil && found {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Refresh reads the slot's state into the gauges; Run calls it every
// RefreshInterval.
func (m *WALMonitor) Refresh(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, max(m.cfg.RefreshInterval, 5*time.Second))
	defer cancel()
	s, found, err := ReadWALSlot(qctx, m.cfg.Pool, m.cfg.Slot)
	if err != nil {
		if ctx.Err() == nil {
			m.refreshFailures.Inc()
			m.log.Debug("could not refresh the slot gauges", "err", err)
		}
		return
	}
	status := s.WALStatus
	if !found {
		status = "missing"
	}
	for _, st := range walStatuses {
		v := 0.0
		if st == status {
			v = 1
		}
		m.walStatus.WithLabelValues(st).Set(v)
	}
	m.lagBytes.Set(float64(s.LagBytes))
	active := 0.0
	if s.Active {
		active = 1
	}
	m.active.Set(active)
}

func (m *WALMonitor) watchdog(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rep, err := CheckWAL(qctx, m.cfg.Pool, m.cfg.Watchdog)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("watchdog could not read the slot; will retry", "err", err)
		}
		return
	}
	for _, p := range rep.Problems {
		m.log.Warn("replication slot unhealthy", "problem", p, "lag_bytes", rep.Slot.LagBytes, "wal_status", rep.Slot.WALStatus)
	}
}

func (m *WALMonitor) cleanup(ctx context.Context) {
	res, err := Cleanup(ctx, m.cfg.Pool, m.cfg.Cleanup)
	switch {
	case errors.Is(err, ErrCleanupRunning):
		m.log.Debug("cleanup skipped: another replica is running it")
		return
	case err != nil:
		if ctx.Err() == nil {
			m.log.Warn("cleanup failed; will retry at the next interval", "err", err, "deleted", res.Outbox.Deleted)
		}
		return
	}
	m.cleanupDeleted.WithLabelValues("outbox").Add(float64(res.Outbox.Deleted))
	m.cleanupDeleted.WithLabelValues("processed").Add(float64(res.Processed.Deleted))
	m.cleanupLast.SetToCurrentTime()
	m.log.Info("cleanup done", "mode", "wal", "wal_horizon", res.WALHorizon,
		"outbox_deleted", res.Outbox.Deleted, "outbox_batches", res.Outbox.Batches,
		"processed_deleted", res.Processed.Deleted, "failures_pruned", res.Failures, "next_in", m.cfg.CleanupInterval)
}
