package e2e_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer/webhookconsumer"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// hookSecret is the e2e tests' signing secret (not a real one).
const hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// hookFaults is how a test endpoint misbehaves.
type hookFaults struct {
	// fail is the share of requests answered 500 or 503.
	fail float64
	// throttle is the share answered 429 with a Retry-After (seconds or
	// an HTTP date, taking turns).
	throttle float64
	// slow is the most a request waits before its answer.
	slow time.Duration
	// refuse answers these event ids 422, and forbid these 403.
	refuse, forbid map[int64]bool
}

// hookServer is a webhook endpoint for the e2e tests: it verifies every
// signature and keeps what it accepted, in the order it accepted it.
type hookServer struct {
	t      *testing.T
	faults hookFaults
	v      *webhookconsumer.Verifier
	addr   string

	mu       sync.Mutex
	srv      *http.Server
	got      []delivered
	requests map[int]int // status -> count
}

func newHookServer(t *testing.T, f hookFaults) *hookServer {
	t.Helper()
	secrets, err := webhookconsumer.ParseSecrets(hookSecret)
	require.NoError(t, err)
	v, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: secrets})
	require.NoError(t, err)
	h := &hookServer{t: t, faults: f, v: v, addr: freeAddr(t), requests: map[int]int{}}
	h.up()
	t.Cleanup(h.down)
	return h
}

// up starts serving on h.addr; down stops (the endpoint goes away).
func (h *hookServer) up() {
	l, err := net.Listen("tcp", h.addr)
	require.NoError(h.t, err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	h.mu.Lock()
	h.srv = srv
	h.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

func (h *hookServer) down() {
	h.mu.Lock()
	srv := h.srv
	h.mu.Unlock()
	_ = srv.Close()
}

func (h *hookServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	code := h.answer(r, body)
	if code == http.StatusTooManyRequests {
		if rand.IntN(2) == 0 {
			w.Header().Set("Retry-After", "1")
		} else {
			w.Header().Set("Retry-After", time.Now().Add(time.Second).UTC().Format(http.TimeFormat))
		}
	}
	if h.faults.slow > 0 {
		time.Sleep(rand.N(h.faults.slow))
	}
	w.WriteHeader(code)
}

// answer decides the status of one request, keeping it when it is 2xx.
func (h *hookServer) answer(r *http.Request, body []byte) int {
	if err := h.v.Verify(r.Header, body); err != nil {
		h.t.Errorf("webhook endpoint: %v", err)
		return http.StatusUnauthorized
	}
	ev, err := webhookconsumer.ReadEvent(r.Header, body)
	if err != nil {
		h.t.Errorf("webhook endpoint: %v", err)
		return http.StatusBadRequest
	}
	code := http.StatusNoContent
	switch p := rand.Float64(); {
	case h.faults.refuse[ev.ID]:
		code = http.StatusUnprocessableEntity
	case h.faults.forbid[ev.ID]:
		code = http.StatusForbidden
	case p < h.faults.fail/2:
		code = http.StatusInternalServerError
	case p < h.faults.fail:
		code = http.StatusServiceUnavailable
	case p < h.faults.fail+h.faults.throttle:
		code = http.StatusTooManyRequests
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.requests[code]++
	if code == http.StatusNoContent {
		h.got = append(h.got, delivered{key: ev.AggregateID.String(), id: ev.ID, source: ev.Source})
	}
	return code
}

func (h *hookServer) accepted() []delivered {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]delivered(nil), h.got...)
}

func (h *hookServer) statuses() map[int]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[int]int{}
	for k, v := range h.requests {
		out[k] = v
	}
	return out
}

// sinkURL is the relay's --sink for h, its secret in a file.
func (h *hookServer) sinkURL(t *testing.T, query string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(f, []byte(hookSecret), 0o600))
	u := "http://" + h.addr + "/outbox?secret_file=" + url.QueryEscape(f)
	if query != "" {
		u += "&" + query
	}
	return u
}

func webhookRelayArgs(db *pgtest.DB, sink string, extra ...string) []string {
	return append([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--sink", sink,
		"--batch-size", fmt.Sprint(batchSize), "--poll-interval", "100ms", "--delivery-timeout", "3s", "--log-level", "warn"}, extra...)
}

// drainHooks waits until nothing is pending, then stops the relayers with
// SIGTERM.
func drainHooks(t *testing.T, db *pgtest.DB, timeout time.Duration, ps ...*proc) {
	t.Helper()
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, timeout, 200*time.Millisecond,
		"outbox did not drain (%d pending); relayer output:\n%s", pending(t, db), ps[0].out.String())
	for _, p := range ps {
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0: %s", p.out.String())
	}
}

// An endpoint that fails 30% of its requests (500 and 503), throttles
// 10% more (429 with Retry-After, in seconds and as a date) and answers
// slowly: every committed event is accepted, each aggregate's in order
// (first acceptances ascend), every request signed.
func TestWebhookFlakyEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	h := newHookServer(t, hookFaults{fail: 0.3, throttle: 0.1, slow: 20 * time.Millisecond})
	committed := writers(t, ctx, db, 3_000, 200, 2, 50, time.Second)
	p := start(t, webhookRelayArgs(db, h.sinkURL(t, "concurrency=32"))...)
	drainHooks(t, db, 5*time.Minute, p)
	got := h.accepted()
	dups := verify(t, committed, got)
	st := h.statuses()
	t.Logf("3,000 events: %d accepted (%d duplicates); answers %v", len(got), dups, st)
	require.Greater(t, st[http.StatusServiceUnavailable]+st[http.StatusInternalServerError], 300, "the endpoint failed requests")
	require.Greater(t, st[http.StatusTooManyRequests], 50, "the endpoint throttled requests")
}

// Three relayers at once on one outbox, to a flaky endpoint: nothing
// lost, each aggregate's events first accepted in order.
func TestWebhookThreeRelaysKeepOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	h := newHookServer(t, hookFaults{fail: 0.1, slow: 5 * time.Millisecond})
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, ctx, db, 6_000, 100, 3, 50, 3*time.Second) }()
	var ps []*proc
	for i := range 3 {
		ps = append(ps, start(t, webhookRelayArgs(db, h.sinkURL(t, ""), "--source", fmt.Sprint("relay-", i))...))
	}
	committed := <-done
	drainHooks(t, db, 5*time.Minute, ps...)
	got := h.accepted()
	dups := verify(t, committed, got)
	by := map[string]int{}
	for _, d := range got {
		by[d.source]++
	}
	t.Logf("6,000 events, 3 relays: %d accepted (%d duplicates), by relay %v", len(got), dups, by)
}

// SIGKILL the relayer ten times during a 20,000-event load: nothing
// lost, order kept, duplicates bounded by a batch per kill.
func TestWebhookTenSIGKILLs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("20,000 events and ten process kills; skipped with -short")
	}
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	h := newHookServer(t, hookFaults{})
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, ctx, db, 20_000, 500, 4, 50, 3*time.Second) }()
	sink := h.sinkURL(t, "concurrency=64")
	p := start(t, webhookRelayArgs(db, sink)...)
	for range 10 {
		time.Sleep(time.Duration(150+rand.IntN(600)) * time.Millisecond)
		p.signal(t, syscall.SIGKILL)
		p.wait(t, 10*time.Second)
		p = start(t, webhookRelayArgs(db, sink)...)
	}
	committed := <-done
	drainHooks(t, db, 5*time.Minute, p)
	got := h.accepted()
	dups := verify(t, committed, got)
	t.Logf("20,000 events, 10 SIGKILLs: %d accepted, %d duplicates (bound %d)", len(got), dups, 10*batchSize)
	require.LessOrEqual(t, dups, 10*batchSize)
}

// The endpoint goes away for 5 s mid-drain (its server closed, then
// started again on the same port): the relayer retries and loses nothing.
func TestWebhookEndpointDownAndBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	h := newHookServer(t, hookFaults{slow: 2 * time.Millisecond})
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, ctx, db, 5_000, 200, 2, 50, 4*time.Second) }()
	p := start(t, webhookRelayArgs(db, h.sinkURL(t, ""))...)
	require.Eventually(t, func() bool { return len(h.accepted()) > 500 }, time.Minute, 20*time.Millisecond)
	h.down()
	before := len(h.accepted())
	time.Sleep(5 * time.Second)
	h.up()
	committed := <-done
	drainHooks(t, db, 5*time.Minute, p)
	got := h.accepted()
	dups := verify(t, committed, got)
	t.Logf("5,000 events, endpoint down 5 s after %d: %d accepted, %d duplicates", before, len(got), dups)
}

// Each poison shape is held on its own row with its reason, while the
// rows beside it (other aggregates) go through: a request over max_bytes
// (too_large), a type whose topic is too long and one with no route
// (invalid_topic), an event the
// endpoint answers 422 (broker_refused) and one it answers 403
// (not_authorized), and a header HTTP cannot take (reserved_header).
func TestWebhookPoisonRowsHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	insert := func(agg uuid.UUID, typ, payload, headers string) int64 {
		var id int64
		require.NoError(t, db.Pool.QueryRow(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload, headers) VALUES ($1, $2, $3, NULLIF($4, '')::jsonb) RETURNING id",
			agg, typ, payload, headers).Scan(&id))
		return id
	}
	want := map[int64]string{}
	var good []int64
	goodAgg := uuid.New()
	for i, c := range []struct{ typ, payload, headers, reason string }{
		{"order.placed", fmt.Sprintf(`{"pad": "%0*d"}`, 20_000, 0), "", "too_large"},
		{strings.Repeat("o", 210) + ".placed", `{}`, "", "invalid_topic"},
		{"order.placed", `{}`, "", "broker_refused"},
		{"order.placed", `{}`, "", "not_authorized"},
		{"order.placed", `{}`, `{"content-length": "1"}`, "reserved_header"},
		{"invoice.sent", `{}`, "", "invalid_topic"}, // no route: the routes file routes only "order"
	} {
		good = append(good, insert(goodAgg, "order.placed", fmt.Sprintf(`{"n": %d}`, i), ""))
		want[insert(uuid.New(), c.typ, c.payload, c.headers)] = c.reason
	}
	ids := make([]int64, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	refuse, forbid := map[int64]bool{}, map[int64]bool{}
	for id, r := range want {
		refuse[id], forbid[id] = r == "broker_refused", r == "not_authorized"
	}
	h := newHookServer(t, hookFaults{refuse: refuse, forbid: forbid})
	routes := filepath.Join(t.TempDir(), "routes")
	require.NoError(t, os.WriteFile(routes, []byte("order http://"+h.addr+"/orders\n* -\n"), 0o600))
	p := start(t, webhookRelayArgs(db, h.sinkURL(t, "max_bytes=10000&routes="+url.QueryEscape(routes)))...)
	failures := "SELECT event_id, reason FROM " + migrate.FailuresIdent(db.Tables)
	require.Eventually(t, func() bool {
		rows, err := db.Pool.Query(ctx, failures)
		require.NoError(t, err)
		defer rows.Close()
		n := 0
		for rows.Next() {
			var id int64
			var reason string
			require.NoError(t, rows.Scan(&id, &reason))
			require.Equal(t, want[id], reason, "row %d held as %s", id, reason)
			n++
		}
		return n == len(want) && len(h.accepted()) == len(good)
	}, time.Minute, 100*time.Millisecond, "relayer output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))
	require.Equal(t, len(want), pending(t, db), "the poison rows stay pending, held: %v", ids)
	for _, d := range h.accepted() {
		require.Contains(t, good, d.id)
	}
}
