package monitor

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/ops"
)

// walGauges are the WAL source's metrics: the relayer's counters (read
// through Config.WALFigures) and the slot's state, which every replica
// reads from pg_replication_slots, so each reports it.
type walGauges struct {
	lagBytes, active prometheus.Gauge
	walStatus        *prometheus.GaugeVec
	cleanupDeleted   *prometheus.CounterVec
	cleanupLast      prometheus.Gauge
	refreshErrors    prometheus.Counter
}

// walStatuses are the label values of outbox_wal_slot_wal_status: the
// slot's wal_status, or missing.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost", "missing"}

func registerWAL(reg *prometheus.Registry, figures func() WALFigures) *walGauges {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	counter := func(name, help string, v func(WALFigures) int64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(figures())) }))
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		reg.MustRegister(g)
		return g
	}
	// The same name as the polling relay's, without its topic label: the
	// WAL relayer counts events, not topics.
	counter("outbox_events_dispatched_total", "Events the broker acknowledged (WAL source: all topics; duplicates re-sent after a restart included).", func(s WALFigures) int64 { return s.Published })
	counter("outbox_batches_total", "Batches this relayer published.", func(s WALFigures) int64 { return s.Batches })
	counter("outbox_failed_batches_total", "Attempts that failed and backed off (broker or database unreachable, leader session lost).", func(s WALFigures) int64 { return s.FailedBatches })
	counter("outbox_wal_parked_total", "Events the broker refused for good or the relayer could not decode, moved to the parked table (the stream went on without them).", func(s WALFigures) int64 { return s.Parked })
	counter("outbox_wal_heartbeats_total", "Heartbeat messages read back from the slot while leading.", func(s WALFigures) int64 { return s.Heartbeats })
	counter("outbox_wal_dropped_total", "Logical messages with the outbox's prefix that were no event: logged, not published.", func(s WALFigures) int64 { return s.Dropped })
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_wal_leader", Help: "1 while this relayer is the slot's reader (the leader), else 0."},
		func() float64 {
			if figures().Leading {
				return 1
			}
			return 0
		}))
	g := &walGauges{}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_wal_slot_lag_seconds", Help: "How long ago the oldest transaction read and not yet acknowledged by the broker committed; 0 when all is acknowledged, and on standbys (take max over replicas)."},
		func() float64 { return figures().Lag.Seconds() }))
	g.lagBytes = gauge("outbox_wal_slot_lag_bytes", "WAL written since the slot's confirmed position (pg_current_wal_lsn() - confirmed_flush_lsn): kept on the server's disk for the slot. Read from pg_replication_slots by every replica.")
	g.active = gauge("outbox_wal_slot_active", "1 while a process streams from the slot, else 0.")
	g.walStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_wal_slot_wal_status", Help: "1 for the slot's wal_status (reserved, extended, unreserved: past max_slot_wal_keep_size, lost: invalidated), or missing when the slot does not exist; 0 for the others."}, []string{"status"})
	reg.MustRegister(g.walStatus)
	g.refreshErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_stats_refresh_errors_total", Help: "Failed reads of the slot gauges; while they fail the gauges keep their last value."})
	reg.MustRegister(g.refreshErrors)
	g.cleanupDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_cleanup_deleted_rows_total", Help: "Rows deleted by retention cleanup, by table (outbox, processed)."}, []string{"table"})
	reg.MustRegister(g.cleanupDeleted)
	g.cleanupLast = gauge("outbox_cleanup_last_success_timestamp_seconds", "Unix time of the last cleanup this process completed.")
	return g
}

// refresh reads the slot's state into the gauges.
func (g *walGauges) refresh(ctx context.Context, db outbox.DB, slot string) error {
	s, found, err := ops.ReadWALSlot(ctx, db, slot)
	if err != nil {
		return err
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
		g.walStatus.WithLabelValues(st).Set(v)
	}
	g.lagBytes.Set(float64(s.LagBytes))
	active := 0.0
	if s.Active {
		active = 1
	}
	g.active.Set(active)
	return nil
}

func (g *walGauges) observeCleanup(res ops.CleanupResult) {
	g.cleanupDeleted.WithLabelValues("outbox").Add(float64(res.Outbox.Deleted))
	g.cleanupDeleted.WithLabelValues("processed").Add(float64(res.Processed.Deleted))
	g.cleanupLast.SetToCurrentTime()
}

// slotSetupGrace is how long the watchdog and cleanup jobs wait for the
// slot to appear before they report it missing.
const slotSetupGrace = 30 * time.Second

// awaitSlot returns once the slot exists, grace has passed or ctx is done.
func (m *Monitor) awaitSlot(ctx context.Context, grace time.Duration) {
	deadline := time.Now().Add(grace)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, found, err := ops.ReadWALSlot(qctx, m.cfg.Pool, m.cfg.Source.Slot())
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
