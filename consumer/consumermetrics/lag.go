package consumermetrics

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
)

// DefaultLagTimeout bounds the broker requests of one lag read.
const DefaultLagTimeout = 5 * time.Second

// WatchLag adds outbox_consumer_lag, the records of each partition the
// group has not committed yet (the partition's high watermark minus the
// group's committed offset), read from the brokers at each scrape through
// adm, with outbox_consumer_lag_errors_total counting the reads that
// failed (the lag is then left out of that scrape). group is the
// consumer's Kafka group (consumer.Config.Group); adm wraps a client of
// the consumer's cluster, not the consumer's own.
func (m *Metrics) WatchLag(group string, adm *kadm.Client) {
	c := &lagCollector{
		group: group,
		adm:   adm,
		desc: prometheus.NewDesc("outbox_consumer_lag", "Records of the partition the group has not committed: high watermark minus committed offset (the whole partition when the group never committed).",
			[]string{"topic", "partition"}, prometheus.Labels{"consumer": m.name, "group": group}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_consumer_lag_errors_total",
			Help: "Lag reads from the brokers that failed; the scrape then has no outbox_consumer_lag.", ConstLabels: prometheus.Labels{"consumer": m.name, "group": group}}),
	}
	m.reg.MustRegister(c)
}

// lagCollector reads the group's lag at scrape time.
type lagCollector struct {
	group  string
	adm    *kadm.Client
	desc   *prometheus.Desc
	errors prometheus.Counter
}

func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	c.errors.Describe(ch)
}

func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	defer c.errors.Collect(ch)
	ctx, cancel := context.WithTimeout(context.Background(), DefaultLagTimeout)
	defer cancel()
	lags, err := c.adm.Lag(ctx, c.group)
	if err == nil {
		err = lags.Error()
	}
	if err != nil {
		c.errors.Inc()
		return
	}
	for _, g := range lags {
		for _, l := range g.Lag.Sorted() {
			if l.Err != nil || l.Lag < 0 {
				continue
			}
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(l.Lag), l.Topic, strconv.Itoa(int(l.Partition)))
		}
	}
}
