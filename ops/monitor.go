package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
)

// Monitor defaults, applied by NewMonitor and used by `outbox relay`'s
// flags.
const (
	DefaultRefreshInterval  = 5 * time.Second
	DefaultWatchdogInterval = time.Minute
	DefaultCleanupInterval  = time.Hour
	DefaultCheckTimeout     = 2 * time.Second
)

// MonitorConfig configures a Monitor. Pool is required.
type MonitorConfig struct {
	// Pool connects to the outbox database. Required.
	Pool *pgxpool.Pool
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// RefreshInterval is how often the pending, lag and stuck gauges are
	// read (one query over the pending rows). Defaults to
	// DefaultRefreshInterval (5s).
	RefreshInterval time.Duration
	// StuckAfter: rows pending longer are stuck. Defaults to
	// DefaultStuckAfter (5m).
	StuckAfter time.Duration
	// MaxLag is the lag SLO. Defaults to DefaultMaxLag (5s).
	MaxLag time.Duration
	// WatchdogInterval is how often stuck rows and the SLO are logged.
	// Defaults to DefaultWatchdogInterval (1m).
	WatchdogInterval time.Duration
	// CleanupInterval is how often retention cleanup runs (one replica at a
	// time; see Cleanup). The first run is at start. Defaults to
	// DefaultCleanupInterval (1h).
	CleanupInterval time.Duration
	// DisableCleanup turns the cleanup job off, e.g. when cron runs
	// `outbox cleanup`. Defaults to false.
	DisableCleanup bool
	// Cleanup configures the cleanup job; its Tables and Logger are the
	// Monitor's.
	Cleanup CleanupConfig
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

// ReadyCheck is one readiness condition of /readyz.
type ReadyCheck struct {
	// Name appears in /readyz's answer, e.g. "broker".
	Name string
	// Check returns nil when ready. It gets a context with CheckTimeout.
	Check func(ctx context.Context) error
}

// Monitor runs what a relay process runs beside the relayer: Prometheus
// metrics, /healthz and /readyz, the gauges' refresh, the periodic
// watchdog and retention cleanup. (The relayer records its own holds in the
// failures table, where the gauges, the watchdog and `outbox events` read
// them.)
//
//	mon, _ := ops.NewMonitor(ops.MonitorConfig{Pool: pool, Tables: tables})
//	r, _ := relay.New(relay.Config{Common: relay.Common{Pool: pool, Tables: tables, Sink: pub, Hooks: []relay.Hook{mon.Metrics()}}})
//	go mon.Run(ctx)
//	http.ListenAndServe("127.0.0.1:9090", mon.Handler())
type Monitor struct {
	cfg     MonitorConfig
	metrics *Metrics
	log     *slog.Logger
}

// durationDefault is a Config duration, its name for errors, and its
// default.
type durationDefault struct {
	name string
	v    *time.Duration
	def  time.Duration
}

// applyDurationDefaults sets each zero duration to its default and refuses
// a negative one; what names the config in the error.
func applyDurationDefaults(what string, ds []durationDefault) error {
	for _, d := range ds {
		if *d.v < 0 {
			return fmt.Errorf("ops: %s %s is %s; use a positive duration, or 0 for the default", what, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	return nil
}

// NewMonitor validates cfg and applies its defaults.
func NewMonitor(cfg MonitorConfig) (*Monitor, error) {
	if cfg.Pool == nil {
		return nil, errors.New("ops: MonitorConfig.Pool is nil; pass the outbox database's *pgxpool.Pool")
	}
	if err := cfg.Tables.Validate(); err != nil {
		return nil, err
	}
	cfg.Tables = cfg.Tables.WithDefaults()
	if err := applyDurationDefaults("monitor", []durationDefault{
		{"RefreshInterval", &cfg.RefreshInterval, DefaultRefreshInterval},
		{"StuckAfter", &cfg.StuckAfter, DefaultStuckAfter},
		{"MaxLag", &cfg.MaxLag, DefaultMaxLag},
		{"WatchdogInterval", &cfg.WatchdogInterval, DefaultWatchdogInterval},
		{"CleanupInterval", &cfg.CleanupInterval, DefaultCleanupInterval},
		{"CheckTimeout", &cfg.CheckTimeout, DefaultCheckTimeout},
	}); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Cleanup.Tables = cfg.Tables
	cfg.Cleanup.Logger = cfg.Logger
	if _, err := cfg.Cleanup.withDefaults(); err != nil {
		return nil, err
	}
	for _, c := range cfg.Checks {
		if c.Name == "" || c.Check == nil {
			return nil, errors.New("ops: every readiness check needs a Name and a Check func")
		}
	}
	return &Monitor{cfg: cfg, metrics: NewMetrics(), log: cfg.Logger.With("outbox", cfg.Tables.OutboxIdent())}, nil
}

// Metrics returns the monitor's metrics: pass them to the relayer's
// Config.Hooks.
func (m *Monitor) Metrics() *Metrics { return m.metrics }

// Run runs the periodic jobs until ctx is cancelled. Failures are logged
// and retried at the next tick; Run never gives up.
func (m *Monitor) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { every(ctx, m.cfg.RefreshInterval, m.refresh) })
	wg.Go(func() { every(ctx, m.cfg.WatchdogInterval, m.watchdog) })
	if !m.cfg.DisableCleanup {
		wg.Go(func() { every(ctx, m.cfg.CleanupInterval, m.cleanup) })
	}
	wg.Wait()
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

func (m *Monitor) refresh(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, max(m.cfg.RefreshInterval, 5*time.Second))
	defer cancel()
	l, err := ReadLag(qctx, m.cfg.Pool, m.cfg.Tables, m.cfg.StuckAfter)
	if err != nil {
		if ctx.Err() == nil {
			m.metrics.refreshErrors.Inc()
			m.log.Debug("could not refresh outbox gauges", "err", err)
		}
		return
	}
	m.metrics.SetLag(l, m.cfg.MaxLag)
}

// maxStuckLogged bounds the per-row warnings of one watchdog run; the
// count and `outbox watchdog` give the rest.
const maxStuckLogged = 10

func (m *Monitor) watchdog(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rep, err := Check(qctx, m.cfg.Pool, WatchdogConfig{Tables: m.cfg.Tables, StuckAfter: m.cfg.StuckAfter, MaxLag: m.cfg.MaxLag, Limit: maxStuckLogged})
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("watchdog could not read the outbox; will retry", "err", err)
		}
		return
	}
	m.metrics.SetLag(rep.Lag, m.cfg.MaxLag)
	if rep.LagBreached {
		m.log.Warn("outbox lag is over its SLO", "lag", rep.OldestPendingAge.Round(time.Millisecond), "max_lag", m.cfg.MaxLag, "pending", rep.Pending)
	}
	if rep.Lag.Stuck > 0 {
		m.log.Warn("outbox rows are stuck; run 'outbox watchdog' for the list", "stuck", rep.Lag.Stuck, "stuck_after", m.cfg.StuckAfter)
		for _, s := range rep.Stuck {
			args := []any{"event_id", s.ID, "aggregate_id", s.AggregateID, "type", s.Type, "age", s.Age.Round(time.Second)}
			if s.BlockedBy != 0 {
				args = append(args, "blocked_by", s.BlockedBy)
			}
			if s.LastError != "" {
				args = append(args, "reason", s.Reason, "last_error", s.LastError, "attempts", s.Attempts)
			}
			m.log.Warn("stuck outbox row", args...)
		}
	}
}

func (m *Monitor) cleanup(ctx context.Context) {
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
	m.metrics.ObserveCleanup(res)
	m.log.Info("cleanup done",
		"outbox_deleted", res.Outbox.Deleted, "outbox_batches", res.Outbox.Batches, "outbox_duration", res.Outbox.Duration.Round(time.Millisecond),
		"processed_deleted", res.Processed.Deleted, "processed_batches", res.Processed.Batches,
		"failures_pruned", res.Failures, "next_in", m.cfg.CleanupInterval)
}

// Handler serves /metrics, /healthz (the process answers) and /readyz (the
// database and every readiness check answer within CheckTimeout; 503 with
// the reasons otherwise).
func (m *Monitor) Handler() http.Handler {
	return opsHandler(m.metrics.Handler(), m.cfg.Pool.Ping, m.cfg.Checks, m.cfg.CheckTimeout)
}

// opsHandler serves metrics on /metrics, /healthz, and /readyz over the
// database ping and checks.
func opsHandler(metrics http.Handler, ping func(context.Context) error, extra []ReadyCheck, timeout time.Duration) http.Handler {
	checks := append([]ReadyCheck{{Name: "database", Check: ping}}, extra...)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		errs := make([]error, len(checks))
		var wg sync.WaitGroup
		for i, c := range checks {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(r.Context(), timeout)
				defer cancel()
				errs[i] = c.Check(ctx)
			})
		}
		wg.Wait()
		var b strings.Builder
		ready := true
		for i, c := range checks {
			if errs[i] != nil {
				ready = false
				fmt.Fprintf(&b, "%s: not ready: %s\n", c.Name, strings.Join(strings.Fields(errs[i].Error()), " "))
			} else {
				fmt.Fprintf(&b, "%s: ok\n", c.Name)
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, b.String())
	})
	return mux
}
