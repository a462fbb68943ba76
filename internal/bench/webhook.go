package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/webhookwire"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/webhookpub"
	"github.com/pgoutbox/outbox/routing"
)

// benchSecret signs the webhook scenario's requests (not a real secret).
const benchSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// hookReceiver is a loopback webhook endpoint that verifies every
// signature and counts what it accepted.
type hookReceiver struct {
	url      string
	srv      *http.Server
	secrets  []webhookwire.Secret
	accepted atomic.Int64
	bad      atomic.Int64
}

func startReceiver() (*hookReceiver, error) {
	secrets, err := webhookwire.ParseSecrets(benchSecret)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hookReceiver{url: "http://" + l.Addr().String() + "/outbox", secrets: secrets}
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = h.srv.Serve(l) }()
	return h, nil
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	hd := r.Header
	if err != nil || webhookwire.Verify(h.secrets, hd.Get(webhookwire.HeaderID), hd.Get(webhookwire.HeaderTimestamp), hd.Get(webhookwire.HeaderSignature), body, time.Now(), time.Minute) != nil {
		h.bad.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	h.accepted.Add(1)
	w.WriteHeader(http.StatusNoContent)
}

func (h *hookReceiver) close() { _ = h.srv.Close() }

func (h *hookReceiver) publisher(s *session) (*webhookpub.Publisher, error) {
	return webhookpub.New(webhookpub.Config{Endpoint: h.url, Secrets: h.secrets, Logger: s.cfg.Logger})
}

func runWebhook(ctx context.Context, s *session) (*Result, error) {
	n := int64(pick(s.cfg.Short, 2_000, min(s.cfg.Events, 50_000)))
	e, err := s.newEnv(ctx, "webhook", int32(latencyWriters(s.cfg.Writers, 1000)))
	if err != nil {
		return nil, err
	}
	defer e.close()
	res := &Result{}
	res.param("endpoint", "a Go net/http server on loopback that verifies every signature and answers 204")
	res.param("relay", "one relayer, defaults (batch 5,000), webhookpub.Publisher with defaults (16 requests in flight, one per aggregate)")
	res.param("baseline", "net/http alone: the same %s messages, signed alike, 16 in flight, each waiting for its 2xx (the relay's durability), one request at a time per aggregate", thousands(n))
	res.param("preload", "%s pending events over %s aggregates", thousands(n), thousands(int64(s.cfg.Aggregates)))

	s.progress("webhook: drain %s events through the relay", thousands(n))
	relayRate, err := webhookDrain(ctx, s, e, n)
	if err != nil {
		return nil, err
	}
	s.progress("webhook: the same %s messages with net/http alone", thousands(n))
	baseRate, err := webhookBaseline(ctx, s, n)
	if err != nil {
		return nil, err
	}
	s.progress("webhook: commit-to-2xx latency at 1,000 events/s")
	st, err := webhookLatency(ctx, s, e, pick(s.cfg.Short, 500*time.Millisecond, 10*time.Second))
	if err != nil {
		return nil, err
	}
	p50, p99 := percentile(st.lat, 50), percentile(st.lat, 99)
	res.Tables = append(res.Tables,
		Table{Title: "drain to a webhook endpoint", Columns: []string{"publisher", "events", "ev/s", "vs net/http"},
			Rows: [][]string{{"outbox relay + webhookpub", thousands(n), rate(relayRate), fmt.Sprintf("%.2fx", relayRate/baseRate)},
				{"net/http alone (16 in flight)", thousands(n), rate(baseRate), "1.00x"}}},
		Table{Title: "commit-to-2xx latency at 1,000 events/s", Columns: []string{"events", "achieved ev/s", "p50 ms", "p99 ms", "max ms"},
			Rows: [][]string{{thousands(st.events), rate(st.achieved), ms(p50), ms(p99), ms(percentile(st.lat, 100))}}})
	res.metric("webhook.relay_per_s", relayRate)
	res.metric("webhook.baseline_per_s", baseRate)
	res.metric("webhook.latency.1000.p50_ms", float64(p50)/float64(time.Millisecond))
	res.metric("webhook.latency.1000.p99_ms", float64(p99)/float64(time.Millisecond))
	res.target("webhook drain vs net/http", ">= 0.6x", fmt.Sprintf("%.2fx", relayRate/baseRate), relayRate/baseRate >= 0.6)
	res.target("webhook latency @1,000/s", "p50 <= 10 ms, p99 <= 40 ms", fmt.Sprintf("%s / %s ms", ms(p50), ms(p99)), p50 <= 10*time.Millisecond && p99 <= 40*time.Millisecond)
	return res, nil
}

// webhookDrain drains n preloaded events through one relayer to a fresh
// receiver and returns events per second.
func webhookDrain(ctx context.Context, s *session, e *env, n int64) (float64, error) {
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
		return 0, err
	}
	h, err := startReceiver()
	if err != nil {
		return 0, err
	}
	defer h.close()
	pub, err := h.publisher(s)
	if err != nil {
		return 0, err
	}
	g, err := e.startRelayers(ctx, nil, 1, "", false, func(c *relay.Config) { c.Sink = pub })
	if err != nil {
		return 0, err
	}
	elapsed, werr := g.waitFor(ctx, n, drainTimeout(n))
	if err := g.stop(); err != nil || werr != nil {
		return 0, fmt.Errorf("webhook drain: %w", errOr(werr, err))
	}
	if got := h.accepted.Load(); got < n || h.bad.Load() > 0 {
		return 0, fmt.Errorf("webhook drain: the endpoint accepted %d of %d events (%d bad signatures)", got, n, h.bad.Load())
	}
	return perSecond(n, elapsed), nil
}

func errOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// webhookBaseline sends n messages like the preload's with net/http
// alone, as the relay would: signed, 16 in flight, one per aggregate.
func webhookBaseline(ctx context.Context, s *session, n int64) (float64, error) {
	h, err := startReceiver()
	if err != nil {
		return 0, err
	}
	defer h.close()
	aggs := make([]uuid.UUID, s.cfg.Aggregates)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = webhookpub.DefaultConcurrency
	client := &http.Client{Transport: tr}
	const c = webhookpub.DefaultConcurrency
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	// Worker w sends messages w, w+c, ... in order, to the aggregates
	// whose index is w modulo c, which it alone owns: an aggregate's
	// requests go one at a time, in order.
	per := max(len(aggs)/c, 1)
	for w := range c {
		wg.Go(func() {
			for i := int64(w); i < n; i += c {
				agg := aggs[(int(i/c)%per*c+w)%len(aggs)]
				if err := sendOne(ctx, client, h, i, agg); err != nil {
					mu.Lock()
					firstErr = errOr(firstErr, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return 0, firstErr
	}
	return perSecond(n, elapsed), nil
}

func sendOne(ctx context.Context, client *http.Client, h *hookReceiver, i int64, agg uuid.UUID) error {
	o, err := json.Marshal(newOrder(int(i)))
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(o))
	if err != nil {
		return err
	}
	id, ts := strconv.FormatInt(i+1, 10), time.Now().Unix()
	req.Header["webhook-id"] = []string{id}
	req.Header["webhook-timestamp"] = []string{strconv.FormatInt(ts, 10)}
	req.Header["webhook-signature"] = []string{webhookwire.Sign(h.secrets, id, ts, o)}
	req.Header["outbox-aggregate-id"] = []string{agg.String()}
	req.Header["content-type"] = []string{outbox.ContentTypeJSON}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("baseline: endpoint answered %d", resp.StatusCode)
	}
	return nil
}

// webhookLatency emits one event per transaction at 1,000/s for window
// and measures commit-to-2xx through one relayer.
func webhookLatency(ctx context.Context, s *session, e *env, window time.Duration) (latencyStats, error) {
	var st latencyStats
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()); err != nil {
		return st, err
	}
	h, err := startReceiver()
	if err != nil {
		return st, err
	}
	defer h.close()
	pub, err := h.publisher(s)
	if err != nil {
		return st, err
	}
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables, Routing: routing.Webhook{}})
	if err != nil {
		return st, err
	}
	clock := &ackClock{Sink: pub, acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
	g, err := e.startRelayers(ctx, nil, 1, "", true, func(c *relay.Config) { c.Sink = clock })
	if err != nil {
		return st, err
	}
	defer g.stop() //nolint:errcheck // stopped below; a second stop is a no-op
	time.Sleep(300 * time.Millisecond)
	st.writers = latencyWriters(s.cfg.Writers, 1000)
	em, err := emitAtRate(ctx, s, e, p, clock, latencyRun{rate: 1000}, window, st.writers)
	if err != nil {
		return st, err
	}
	if _, err := g.waitFor(ctx, em.events, 30*time.Second); err != nil {
		return st, err
	}
	if err := g.stop(); err != nil {
		return st, err
	}
	st.events, st.achieved = em.events, perSecond(em.events, em.elapsed)
	st.lat, err = clock.latencies()
	return st, err
}
