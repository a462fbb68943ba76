package monitor_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// bundle is opstest.Bundle, with this package's own helpers.
type bundle struct{ *opstest.Bundle }

func setup(t *testing.T) *bundle { return &bundle{opstest.Setup(t)} }

func TestMain(m *testing.M) { opstest.Main(m) }

// metrics is one scrape of /metrics.
type metrics map[string]*dto.MetricFamily

func scrape(t *testing.T, url string) metrics {
	t.Helper()
	m, err := tryScrape(url)
	require.NoError(t, err)
	return m
}

// tryScrape is scrape for Eventually conditions, which run off the test's
// goroutine and must not call t.FailNow.
func tryScrape(url string) (metrics, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// val is value without the ok, for conditions: absent reads as 0.
func (m metrics) val(name string, labels ...string) float64 {
	v, _ := m.value(name, labels...)
	return v
}

// value is the value of the sample of name whose labels include the given
// name/value pairs (summed over matching samples); a histogram gives its
// sample count. ok is false when the family or a matching sample is absent.
func (m metrics) value(name string, labels ...string) (v float64, ok bool) {
	mf := m[name]
	if mf == nil {
		return 0, false
	}
	for _, s := range mf.GetMetric() {
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range s.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		ok = true
		switch {
		case s.Counter != nil:
			v += s.Counter.GetValue()
		case s.Gauge != nil:
			v += s.Gauge.GetValue()
		case s.Histogram != nil:
			v += float64(s.Histogram.GetSampleCount())
		}
	}
	return v, ok
}

func (m metrics) must(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := m.value(name, labels...)
	require.True(t, ok, "metric %s%v missing from /metrics", name, labels)
	return v
}

// monitor builds a Monitor on the bundle with fast intervals; mod adjusts
// its config.
func (b *bundle) monitor(t *testing.T, mod func(*monitor.Config)) *monitor.Monitor {
	t.Helper()
	cfg := monitor.Config{
		Pool:             b.DB.Pool,
		Tables:           b.DB.Tables,
		RefreshInterval:  50 * time.Millisecond,
		WatchdogInterval: 200 * time.Millisecond,
		DisableCleanup:   true,
		Logger:           opstest.Logger(t),
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := monitor.New(cfg)
	require.NoError(t, err)
	return m
}

// walSetup gives a schema on the logical cluster with the outbox's slot
// and publication created (walrelay.Setup), as a WAL relay leaves them.
func walSetup(t *testing.T) (*pgtest.DB, string) {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6, ServerURL: opstest.NeedLogical(t, "the WAL monitor tests")})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	require.NoError(t, walrelay.Setup(context.Background(), db.Pool, db.Tables, slot, slot))
	t.Cleanup(func() { _ = walrelay.Teardown(context.Background(), db.Pool, slot, slot) })
	return db, slot
}
