package consumermetrics_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/consumermetrics"
)

// The consumer's counters are read at scrape time, each under its own name
// with the consumer label, and /healthz answers.
func TestConsumerMetricsReadStatsAtScrape(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	stats := func() consumer.Stats {
		n := calls.Add(1)
		return consumer.Stats{Records: 10 * n, Processed: 7, Duplicates: 2, DeadLettered: 3, Malformed: 1, DeadLetterDropped: 4, Retries: 5}
	}
	m := consumermetrics.New("loyalty", stats)
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)

	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, body := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)

	code, body = get("/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, line := range []string{
		`outbox_consumer_records_total{consumer="loyalty"} 10`,
		`outbox_consumer_processed_total{consumer="loyalty"} 7`,
		`outbox_consumer_duplicates_total{consumer="loyalty"} 2`,
		`outbox_consumer_dead_letters_total{consumer="loyalty"} 3`,
		`outbox_consumer_malformed_total{consumer="loyalty"} 1`,
		`outbox_consumer_dead_letter_dropped_total{consumer="loyalty"} 4`,
		`outbox_consumer_retries_total{consumer="loyalty"} 5`,
		"# TYPE outbox_consumer_dead_letters_total counter",
		"go_goroutines", "process_start_time_seconds",
	} {
		require.Contains(t, body, line)
	}
	_, body = get("/metrics")
	require.Contains(t, body, `outbox_consumer_records_total{consumer="loyalty"} 20`, "read again at the next scrape")

	// Describe and Collect agree: a pedantic registry checks it at gather.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(consumermetrics.NewCollector("x", func() consumer.Stats { return consumer.Stats{} }))
	families, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, families, 7)
	for _, f := range families {
		require.Equal(t, dto.MetricType_COUNTER, f.GetType(), f.GetName())
		require.True(t, strings.HasPrefix(f.GetName(), "outbox_consumer_") && strings.HasSuffix(f.GetName(), "_total"), f.GetName())
		require.Equal(t, "x", f.GetMetric()[0].GetLabel()[0].GetValue())
	}
}
