package consumermetrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/internal/health"
)

// Metrics are a consumer process's Prometheus metrics: the consumer's
// Stats counters, read at scrape time and labelled with the consumer name,
// on a registry of their own with the Go runtime and process collectors;
// with WatchLag, the group's lag per partition.
//
//	cons, err := consumer.New(cfg)
//	m := consumermetrics.New(cfg.Name, cons.Stats)
//	m.WatchLag(cfg.Group, kadm.NewClient(adminClient))
//	go http.ListenAndServe("127.0.0.1:9091", m.Handler(consumermetrics.ReadyCheck{Name: "database", Check: pool.Ping}))
//
// The package links the consumer and Prometheus, and nothing of the relay.
type Metrics struct {
	name string
	reg  *prometheus.Registry
}

// New registers a collector of stats, labelled consumer=name, on a fresh
// registry. stats is called once per scrape and must be safe to call
// concurrently with the consumer (Consumer.Stats is).
func New(name string, stats func() consumer.Stats) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(NewCollector(name, stats))
	return &Metrics{name: name, reg: reg}
}

// Registry is where the metrics live; register your own collectors on it
// to serve them on the same endpoint.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ReadyCheck is one readiness condition of /readyz: a Name, e.g.
// "broker", and a Check func that returns nil when ready.
type ReadyCheck = health.Check

// DefaultCheckTimeout bounds each readiness check of Handler.
const DefaultCheckTimeout = 2 * time.Second

// Handler serves /metrics, /healthz (the process answers) and /readyz
// (every check answers nil within DefaultCheckTimeout; 503 with the
// reasons otherwise; ready when there is no check).
func (m *Metrics) Handler(checks ...ReadyCheck) http.Handler {
	return health.Handler(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}), checks, DefaultCheckTimeout)
}

// consumerCounter is one counter of consumer.Stats.
type consumerCounter struct {
	desc  *prometheus.Desc
	value func(consumer.Stats) int64
}

// consumerCollector turns consumer.Stats into counters at scrape time, so
// the consumer keeps its own atomic counters and knows nothing of
// Prometheus.
type consumerCollector struct {
	stats    func() consumer.Stats
	counters []consumerCounter
}

// NewCollector returns a collector of the counters of stats, labelled
// consumer=name: outbox_consumer_records_total, _processed_total,
// _duplicates_total, _dead_letters_total, _malformed_total,
// _dead_letter_dropped_total and _retries_total. Register it on a registry
// of your own; New does.
func NewCollector(name string, stats func() consumer.Stats) prometheus.Collector {
	c := &consumerCollector{stats: stats}
	add := func(metric, help string, value func(consumer.Stats) int64) {
		c.counters = append(c.counters, consumerCounter{
			desc:  prometheus.NewDesc("outbox_consumer_"+metric, help, nil, prometheus.Labels{"consumer": name}),
			value: value,
		})
	}
	add("records_total", "Records received from Kafka, redeliveries included.",
		func(s consumer.Stats) int64 { return s.Records })
	add("processed_total", "Events handled for the first time under this consumer name: handler ran and committed.",
		func(s consumer.Stats) int64 { return s.Processed })
	add("duplicates_total", "Events already processed under this consumer name, skipped.",
		func(s consumer.Stats) int64 { return s.Duplicates })
	add("dead_letters_total", "Records written to a dead-letter topic (<topic>.dlq), whole or as a pointer record; malformed ones included.",
		func(s consumer.Stats) int64 { return s.DeadLettered })
	add("malformed_total", "Records that are not outbox events (no or bad event_id, payload not JSON, a type with no handler), dead-lettered at once.",
		func(s consumer.Stats) int64 { return s.Malformed })
	add("dead_letter_dropped_total", "Records whose dead letter the broker refused even as a pointer record: logged and skipped, lost to the dead-letter topic.",
		func(s consumer.Stats) int64 { return s.DeadLetterDropped })
	add("retries_total", "Records tried again after the handler failed, a deadlock, or an unreachable database.",
		func(s consumer.Stats) int64 { return s.Retries })
	return c
}

func (c *consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, k := range c.counters {
		ch <- k.desc
	}
}

func (c *consumerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for _, k := range c.counters {
		ch <- prometheus.MustNewConstMetric(k.desc, prometheus.CounterValue, float64(k.value(s)))
	}
}
