package ops

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/relay"
)

// Metrics are a relay process's Prometheus metrics, on a registry of their
// own (not the global one), so that several relayers, or parallel tests,
// each have theirs. Feed them with Publisher (per-topic and per-reason
// counts), ObserveBatch (the relayer's OnBatch), ObserveRelayer, SetLag and
// ObserveCleanup; a Monitor does all of that.
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

	cleanupDeleted *prometheus.CounterVec
	cleanupLast    prometheus.Gauge

	mu        sync.Mutex
	decorated bool
	last      publishRecord // the latest Publish call, for ObserveBatch
}

// publishRecord is what the Publisher decorator learnt from one Publish
// call: the rows the relayer will mark dispatched, by topic, and how many
// permanent errors the broker returned.
type publishRecord struct {
	at        time.Time
	byTopic   map[string]int
	permanent int
}

// Label values of outbox_publish_errors_total that are not Kafka error
// names.
const (
	// CodeRejectedByRelay: the relayer refused the row before sending it
	// (headers it cannot decode, a type routing to no valid topic).
	CodeRejectedByRelay = "rejected_by_relay"
	codeTimeout         = "timeout"
	codeRetries         = "retries_exhausted"
	codeCanceled        = "canceled"
	codeClientClosed    = "client_closed"
	codeBufferFull      = "buffer_full"
	codeOther           = "other"
	codeUnknown         = "unknown" // OnBatch counts without the decorator
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
		Help: "Events not published, by kind (permanent: held out, needs a person; transient: retried) and code (the Kafka error name, rejected_by_relay, timeout, ...).",
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
		Help: "Pending events whose last attempt failed for good, by reason (too_large, undecodable, invalid_topic, reserved_header, not_authorized, broker_refused): each holds up the rest of its aggregate until retried or parked ('outbox events'). Read from the database, so every replica reports the same figure.",
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
	m.cleanupDeleted = f(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outbox_cleanup_deleted_rows_total",
		Help: "Rows deleted by retention cleanup, by table (outbox, processed).",
	}, []string{"table"})).(*prometheus.CounterVec)
	m.cleanupLast = gauge("outbox_cleanup_last_success_timestamp_seconds", "Unix time of the last cleanup this process completed.")
	return m
}

// Registry is where the metrics live; register your own collectors on it
// to serve them on the same endpoint.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Publisher wraps p so that every publish is counted: dispatched events by
// topic, errors by kind and code. Use it as the relayer's Publisher and
// feed ObserveBatch from the relayer's OnBatch.
func (m *Metrics) Publisher(p relay.Publisher) relay.Publisher {
	m.mu.Lock()
	m.decorated = true
	m.mu.Unlock()
	return &countingPublisher{next: p, m: m}
}

type countingPublisher struct {
	next relay.Publisher
	m    *Metrics
}

func (p *countingPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := p.next.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		return errs // the relayer fails the batch
	}
	// The relayer marks, per aggregate, the acknowledged prefix only, and
	// counts a failure against the aggregate's first failed row only (the
	// rows behind it, sent or not, are deferred); rows it never sent
	// (refused, or behind a refused row) are not in msgs. Replaying its rule
	// here gives exactly the rows it will mark and the failures it sees.
	rec := publishRecord{byTopic: map[string]int{}}
	failed := map[uuid.UUID]bool{}
	for i, msg := range msgs {
		err := errs[i]
		if failed[msg.AggregateID] {
			continue
		}
		if err == nil {
			rec.byTopic[msg.Topic]++
			continue
		}
		failed[msg.AggregateID] = true
		kind := "transient"
		if relay.IsPermanent(err) {
			kind = "permanent"
			rec.permanent++
		}
		p.m.publishErrors.WithLabelValues(kind, errorCode(err)).Inc()
	}
	rec.at = time.Now()
	p.m.mu.Lock()
	p.m.last = rec
	p.m.mu.Unlock()
	return errs
}

// errorCode names a publish error for the code label: the Kafka protocol
// error name when the broker sent one (MESSAGE_TOO_LARGE, ...), else a
// client-side cause. The set is bounded, as a label's values must be.
func errorCode(err error) string {
	var ke *kerr.Error
	switch {
	case errors.As(err, &ke):
		return ke.Message
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, context.DeadlineExceeded):
		return codeTimeout
	case errors.Is(err, kgo.ErrRecordRetries):
		return codeRetries
	case errors.Is(err, context.Canceled), errors.Is(err, kgo.ErrAborting):
		return codeCanceled
	case errors.Is(err, kgo.ErrClientClosed):
		return codeClientClosed
	case errors.Is(err, kgo.ErrMaxBuffered):
		return codeBufferFull
	}
	return codeOther
}

// ObserveBatch records one batch; use it as (or call it from) the
// relayer's OnBatch.
func (m *Metrics) ObserveBatch(res relay.BatchResult) {
	// The relayer calls Publish, then OnBatch, on one goroutine. A publish
	// record belongs to this batch only if it was made after the batch
	// began: one left over from a batch that failed to commit (and so had
	// no OnBatch) is stale.
	began := time.Now().Add(-res.Duration)
	m.mu.Lock()
	rec, decorated := m.last, m.decorated
	m.last = publishRecord{}
	m.mu.Unlock()
	fresh := !rec.at.IsZero() && !rec.at.Before(began)

	counted := 0
	if fresh {
		for topic, n := range rec.byTopic {
			m.dispatched.WithLabelValues(topic).Add(float64(n))
			counted += n
		}
	}
	if rest := res.Dispatched - counted; rest > 0 {
		m.dispatched.WithLabelValues(codeUnknown).Add(float64(rest))
	}
	switch {
	case !decorated:
		// Without the decorator the reasons are unknown; count the kinds.
		if res.Permanent > 0 {
			m.publishErrors.WithLabelValues("permanent", codeUnknown).Add(float64(res.Permanent))
		}
		if res.Transient > 0 {
			m.publishErrors.WithLabelValues("transient", codeUnknown).Add(float64(res.Transient))
		}
	default:
		// Permanent failures the broker did not report were the relayer's
		// own refusals, made before sending.
		local := res.Permanent
		if fresh {
			local -= rec.permanent
		}
		if local > 0 {
			m.publishErrors.WithLabelValues("permanent", CodeRejectedByRelay).Add(float64(local))
		}
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

// ObserveRelayer adds metrics read from the relayer on each scrape: its
// batch counters. Call it once per Metrics.
func (m *Metrics) ObserveRelayer(r *relay.Relayer) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "outbox_batches_total",
			Help: "Batches this relayer committed.",
		}, func() float64 { return float64(r.Stats().Batches) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "outbox_failed_batches_total",
			Help: "Batches that failed and were retried after a backoff (broker or database unreachable).",
		}, func() float64 { return float64(r.Stats().FailedBatches) }),
	)
}

// SetLag sets the pending, stuck and lag gauges, and the SLO flag.
func (m *Metrics) SetLag(l Lag, maxLag time.Duration) {
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
func (m *Metrics) ObserveCleanup(res CleanupResult) {
	m.cleanupDeleted.WithLabelValues("outbox").Add(float64(res.Outbox.Deleted))
	m.cleanupDeleted.WithLabelValues("processed").Add(float64(res.Processed.Deleted))
	m.cleanupLast.SetToCurrentTime()
}
