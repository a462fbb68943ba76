package monitor

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay"
)

// Metrics are a relay process's Prometheus metrics, on a registry of their
// own (not the global one), so that several relayers, or parallel tests,
// each have theirs. They are a relay.Hook: pass them in the relayer's
// Config.Hooks and they count its batches, publish failures and holds.
// SetLag and ObserveCleanup feed the rest; a Monitor does that.
//
//	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: pub, Hooks: []relay.Hook{mon.Metrics()}}})
type Metrics struct {
	reg *prometheus.Registry

	dispatched    *prometheus.CounterVec
	publishErrors *prometheus.CounterVec
	batchSize     prometheus.Histogram
	batchDuration prometheus.Histogram
	latency       prometheus.Histogram

	pending, oldestAge, stuck, lagBreached prometheus.Gauge
	held                                   *prometheus.GaugeVec
	oldestHeld                             prometheus.Gauge
	holds                                  *prometheus.CounterVec
	refreshErrors                          prometheus.Counter

	batches, failedBatches prometheus.Counter

	cleanupDeleted *prometheus.CounterVec
	cleanupLast    prometheus.Gauge

	lanes *LaneMetrics
}

// Metrics observe every batch, failure and failed batch of a relayer.
var (
	_ relay.BatchHook          = (*Metrics)(nil)
	_ relay.PublishFailureHook = (*Metrics)(nil)
	_ relay.BatchErrorHook     = (*Metrics)(nil)
	_ relay.LaneHook           = (*Metrics)(nil)
)

// Label values of outbox_publish_errors_total that are not the sink's
// (relay.Sink.ErrorCode).
const (
	// CodeRejectedByRelay: the relayer refused the row before sending it
	// (headers it cannot decode, a type routing to no valid topic).
	CodeRejectedByRelay = "rejected_by_relay"
	// codeOther: a sink that named no code.
	codeOther = "other"
)

// NewMetrics builds the metrics on a fresh registry, with the Go runtime
// and process collectors.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	f := func(c prometheus.Collector) prometheus.Collector { reg.MustRegister(c); return c }
	m := &Metrics{reg: reg}
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.dispatched = f(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outbox_events_dispatched_total",
		Help: "Events the broker acknowledged and the relayer marked dispatched, by topic.",
	}, []string{"topic"})).(*prometheus.CounterVec)
	m.publishErrors = f(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outbox_publish_errors_total",
		Help: "Events not published, by kind (permanent: held out, needs a person; transient: retried) and code (the sink's error name, e.g. Kafka's, rejected_by_relay, timeout, ...).",
	}, []string{"kind", "code"})).(*prometheus.CounterVec)
	m.batchSize = f(prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "outbox_batch_size_events",
		Help:    "Events claimed and published per batch.",
		Buckets: []float64{1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000},
	})).(prometheus.Histogram)
	m.batchDuration = f(prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "outbox_batch_duration_seconds",
		Help:    "Time from a batch's claim to its commit.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16), // 1ms to 33s
	})).(prometheus.Histogram)
	m.latency = f(prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "outbox_commit_to_publish_seconds",
		Help:    "Time from an event's commit into the outbox (created_at) to the broker's acknowledgement.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900},
	})).(prometheus.Histogram)
	gauge := func(name, help string) prometheus.Gauge {
		return f(prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})).(prometheus.Gauge)
	}
	m.pending = gauge("outbox_pending_events", "Committed events not yet dispatched.")
	m.oldestAge = gauge("outbox_oldest_pending_age_seconds", "Age of the oldest pending event: the dispatch lag.")
	m.stuck = gauge("outbox_stuck_events", "Events pending longer than the stuck-after threshold.")
	m.lagBreached = gauge("outbox_lag_slo_breached", "1 while the oldest pending event is older than the lag SLO (max-lag), else 0.")
	m.held = f(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "outbox_held_events",
		Help: "Pending events whose last attempt failed for good, by reason (too_large, undecodable, invalid_topic, reserved_header, contract, not_authorized, broker_refused): each holds up the rest of its aggregate until retried or parked ('outbox events'). Read from the database, so every replica reports the same figure.",
	}, []string{"reason"})).(*prometheus.GaugeVec)
	m.oldestHeld = gauge("outbox_oldest_held_age_seconds", "How long the longest-held event has been failing (since its first recorded failure); 0 when none is held.")
	m.holds = f(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outbox_holds_total",
		Help: "Holds this relayer recorded (a row that failed for good, each attempt), by reason.",
	}, []string{"reason"})).(*prometheus.CounterVec)
	m.refreshErrors = f(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outbox_stats_refresh_errors_total",
		Help: "Failed reads of the pending/lag/stuck gauges; while they fail the gauges keep their last value.",
	})).(prometheus.Counter)
	m.batches = f(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outbox_batches_total",
		Help: "Batches this relayer committed.",
	})).(prometheus.Counter)
	m.failedBatches = f(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outbox_failed_batches_total",
		Help: "Batches that failed and were retried after a backoff (broker or database unreachable).",
	})).(prometheus.Counter)
	m.cleanupDeleted = f(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outbox_cleanup_deleted_rows_total",
		Help: "Rows deleted by retention cleanup, by table (outbox, processed).",
	}, []string{"table"})).(*prometheus.CounterVec)
	m.cleanupLast = gauge("outbox_cleanup_last_success_timestamp_seconds", "Unix time of the last cleanup this process completed.")
	m.lanes = NewLaneMetrics()
	f(m.lanes)
	return m
}

// Registry is where the metrics live; register your own collectors on it
// to serve them on the same endpoint.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// OnPublishFailure counts a row that failed, by kind (permanent,
// transient) and code: the sink's name for the error (f.Code), or
// CodeRejectedByRelay; it is a relay.PublishFailureHook.
func (m *Metrics) OnPublishFailure(f relay.PublishFailure) {
	kind := "transient"
	if relay.IsPermanent(f.Err) {
		kind = "permanent"
	}
	code := f.Code
	switch {
	case f.Refused:
		code = CodeRejectedByRelay
	case code == "":
		code = codeOther
	}
	m.publishErrors.WithLabelValues(kind, code).Inc()
}

// OnBatchError counts a failed batch; it is a relay.BatchErrorHook.
func (m *Metrics) OnBatchError(error) { m.failedBatches.Inc() }

// OnBatch records a committed batch: its rows dispatched by topic, its
// holds, its size, duration and latencies. It is a relay.BatchHook.
func (m *Metrics) OnBatch(res relay.BatchResult) {
	m.batches.Inc()
	for topic, n := range res.DispatchedByTopic {
		m.dispatched.WithLabelValues(topic).Add(float64(n))
	}
	for _, h := range res.Holds {
		m.holds.WithLabelValues(h.Reason).Inc()
	}
	m.batchSize.Observe(float64(res.Claimed))
	m.batchDuration.Observe(res.Duration.Seconds())
	for _, l := range res.Latencies {
		m.latency.Observe(l.Seconds())
	}
}

// OnLane counts what happened to a lane with --exactly-once (see
// LaneMetrics); it is a relay.LaneHook.
func (m *Metrics) OnLane(ev relay.LaneEvent) { m.lanes.OnLane(ev) }

// SetLag sets the pending, stuck and lag gauges, and the SLO flag.
func (m *Metrics) SetLag(l ops.Lag, maxLag time.Duration) {
	m.pending.Set(float64(l.Pending))
	m.stuck.Set(float64(l.Stuck))
	m.oldestAge.Set(l.OldestPendingAge.Seconds())
	m.held.Reset()
	for reason, n := range l.HeldByReason {
		m.held.WithLabelValues(reason).Set(float64(n))
	}
	m.oldestHeld.Set(l.OldestHeldAge.Seconds())
	breached := 0.0
	if l.OldestPendingAge > maxLag {
		breached = 1
	}
	m.lagBreached.Set(breached)
}

// ObserveCleanup counts a finished cleanup's deletions.
func (m *Metrics) ObserveCleanup(res ops.CleanupResult) {
	m.cleanupDeleted.WithLabelValues("outbox").Add(float64(res.Outbox.Deleted))
	m.cleanupDeleted.WithLabelValues("processed").Add(float64(res.Processed.Deleted))
	m.cleanupLast.SetToCurrentTime()
}
