package monitor_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay"
)

// Must-show 2: /metrics of a monitor hooked into a real relayer shows the
// listed metrics, and they move as load goes through: the backlog gauges
// rise and fall back to 0, the dispatched counter counts every event by
// topic (and agrees with the relayer), latency and batch histograms fill,
// and both kinds of permanent errors (refused by the broker, refused by the
// relayer) are counted by reason while their rows are held out.
func TestMetricsMoveUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cl := b.Client(t)
	mon := b.monitor(t, nil)
	srv := httptest.NewServer(mon.Handler())
	t.Cleanup(srv.Close)

	rcfg := b.RelayConfig(t, cl)
	rcfg.HoldOut = 300 * time.Millisecond
	rcfg.Hooks = []relay.Hook{mon.Metrics()}
	r, err := relay.New(rcfg)
	require.NoError(t, err)
	opstest.Start(t, mon.Run)

	// A backlog before the relayer runs: the gauges see it.
	const backlog = 200
	for i := range backlog {
		b.Emit(t, uuid.New(), "order.placed", map[string]int{"n": i})
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m, err := tryScrape(srv.URL)
		require.NoError(c, err)
		assert.Equal(c, float64(backlog), m.val("outbox_pending_events"))
		assert.Positive(c, m.val("outbox_oldest_pending_age_seconds"))
	}, 10*time.Second, 50*time.Millisecond, "pending gauge never showed the backlog")
	m := scrape(t, srv.URL)
	_, ok := m.value("outbox_events_dispatched_total")
	require.False(t, ok, "nothing is dispatched yet")
	require.Zero(t, m.must(t, "outbox_commit_to_publish_seconds"))

	// Two rows that cannot go: the "audit" topic's record is too large for
	// it (the publisher learns the topic's 200 bytes from the broker and
	// refuses it as MESSAGE_TOO_LARGE), and a row written by hand with a
	// header that is not a string, which the relayer refuses itself. The
	// audit payload is random, so compression could not have saved it.
	require.NoError(t, b.Broker.CreateTopic("audit", 3, map[string]string{"max.message.bytes": "200"}))
	noise := make([]byte, 300)
	_, _ = rand.Read(noise)
	auditID := b.Emit(t, uuid.New(), "audit.logged", map[string]string{"blob": hex.EncodeToString(noise)})
	// (Written as before migration 6, whose guard now refuses it.)
	var bigID int64
	b.DB.WriteLegacy(t, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "INSERT INTO "+b.DB.Tables.OutboxIdent()+
			` (aggregate_id, type, payload, headers) VALUES ($1, 'order.placed', '{}', '{"retries": 3}') RETURNING id`, uuid.New()).Scan(&bigID)
	})

	opstest.RunRelayer(t, r)
	const load = 300
	for i := range load {
		typ := "order.placed"
		if i%2 == 1 {
			typ = "payment.captured"
		}
		b.Emit(t, uuid.New(), typ, map[string]int{"n": i})
	}
	healthy := float64(backlog + load)
	sawHeld := false
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m, err := tryScrape(srv.URL)
		require.NoError(c, err)
		sawHeld = sawHeld || m.val("outbox_held_events", "reason", relay.ReasonTooLarge) == 1 && m.val("outbox_held_events", "reason", relay.ReasonUndecodable) == 1
		assert.True(c, sawHeld, "both refused rows held, each with its reason")
		assert.Equal(c, 2.0, m.val("outbox_stuck_events"), "held rows are stuck at once")
		assert.Positive(c, m.val("outbox_oldest_held_age_seconds"))
		assert.GreaterOrEqual(c, m.val("outbox_holds_total", "reason", relay.ReasonTooLarge), 1.0)
		assert.GreaterOrEqual(c, m.val("outbox_holds_total", "reason", relay.ReasonUndecodable), 1.0)
		assert.Equal(c, healthy, m.val("outbox_events_dispatched_total"))
		assert.GreaterOrEqual(c, m.val("outbox_publish_errors_total", "kind", "permanent", "code", "MESSAGE_TOO_LARGE"), 1.0)
		assert.GreaterOrEqual(c, m.val("outbox_publish_errors_total", "kind", "permanent", "code", monitor.CodeRejectedByRelay), 1.0)
		assert.Equal(c, 2.0, m.val("outbox_pending_events"))
	}, 20*time.Second, 50*time.Millisecond, "healthy events did not all flow past the refused ones")
	m = scrape(t, srv.URL)
	require.Equal(t, float64(backlog+load/2), m.must(t, "outbox_events_dispatched_total", "topic", "order"))
	require.Equal(t, float64(load/2), m.must(t, "outbox_events_dispatched_total", "topic", "payment"))
	require.GreaterOrEqual(t, m.must(t, "outbox_commit_to_publish_seconds"), healthy)

	// The runbook's last resort: delete the rows. Everything drains.
	b.Exec(t, "DELETE FROM "+b.DB.Tables.OutboxIdent()+" WHERE id = ANY($1)", []int64{auditID, bigID})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m, err := tryScrape(srv.URL)
		require.NoError(c, err)
		assert.Zero(c, m.val("outbox_pending_events"))
		assert.Zero(c, m.val("outbox_oldest_pending_age_seconds"))
		assert.Zero(c, m.val("outbox_held_events", "reason", relay.ReasonTooLarge))
		assert.Zero(c, m.val("outbox_held_events", "reason", relay.ReasonUndecodable))
		assert.Zero(c, m.val("outbox_oldest_held_age_seconds"))
	}, 20*time.Second, 50*time.Millisecond, "pending gauge did not drop to 0 after draining")

	m = scrape(t, srv.URL)
	st := r.Stats()
	require.Equal(t, healthy, m.must(t, "outbox_events_dispatched_total"))
	require.Equal(t, float64(st.Dispatched), m.must(t, "outbox_events_dispatched_total"), "by-topic counts must add up to the relayer's own")
	_, ok = m.value("outbox_events_dispatched_total", "topic", "audit")
	require.False(t, ok, "nothing reached the audit topic")
	require.Equal(t, float64(st.Batches), m.must(t, "outbox_batch_size_events"))
	require.Equal(t, float64(st.Batches), m.must(t, "outbox_batch_duration_seconds"))
	require.Equal(t, float64(st.Batches), m.must(t, "outbox_batches_total"))
	require.Zero(t, m.must(t, "outbox_stuck_events"))
	require.Zero(t, m.must(t, "outbox_lag_slo_breached"))
	for _, name := range []string{"outbox_failed_batches_total", "outbox_stats_refresh_errors_total", "go_goroutines", "process_cpu_seconds_total"} {
		m.must(t, name)
	}
}

// /healthz answers while the process lives; /readyz needs the database
// and the broker, and says which one is missing.
func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cl := b.Client(t)
	// A pool of its own, to close under the monitor.
	pool, err := pgxpool.New(context.Background(), b.DB.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	mon := b.monitor(t, func(c *monitor.Config) {
		c.Pool = pool
		c.CheckTimeout = time.Second
		c.Checks = []monitor.ReadyCheck{{Name: "broker", Check: cl.Ping}}
	})
	srv := httptest.NewServer(mon.Handler())
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
	code, body = get("/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "database: ok\nbroker: ok\n", body)

	b.Broker.Close()
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "database: ok\n")
	require.Contains(t, body, "broker: not ready: ")

	pool.Close()
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "database: not ready: ")
	code, _ = get("/healthz")
	require.Equal(t, http.StatusOK, code)
}
