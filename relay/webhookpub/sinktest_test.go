package webhookpub_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/webhookwire"
	"github.com/pgoutbox/outbox/relay/sinktest"
	"github.com/pgoutbox/outbox/relay/webhookpub"
)

// sinkMaxBytes is the largest request in the suite.
const sinkMaxBytes = 100_000

// testSecret is a fixed secret of the tests (not a real one).
const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// endpoint is a test webhook receiver: it checks every signature, keeps
// what it took per topic, and answers what the faults set say.
type endpoint struct {
	t       *testing.T
	secrets []webhookpub.Secret

	mu        sync.Mutex
	got       map[string][]sinktest.Delivered
	failDest  map[string]int // topic -> status
	failEvent map[int64]int  // event id -> status
}

func newEndpoint(t *testing.T) (*endpoint, *httptest.Server) {
	t.Helper()
	secrets, err := webhookpub.ParseSecrets(testSecret)
	require.NoError(t, err)
	e := &endpoint{t: t, secrets: secrets, got: map[string][]sinktest.Delivered{}, failDest: map[string]int{}, failEvent: map[int64]int{}}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return e, srv
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h := r.Header
	if err := webhookwire.Verify(e.secrets, h.Get(webhookwire.HeaderID), h.Get(webhookwire.HeaderTimestamp), h.Get(webhookwire.HeaderSignature), body, time.Now(), 5*time.Minute); err != nil {
		e.t.Errorf("endpoint: bad signature: %v", err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	topic, _ := webhookwire.Decode(h.Get(webhookwire.HeaderTopic))
	typ, _ := webhookwire.Decode(h.Get(webhookwire.HeaderEventType))
	id, _ := strconv.ParseInt(h.Get(webhookwire.HeaderEventID), 10, 64)
	hdrs, err := webhookwire.EventHeaders(h)
	if err != nil {
		e.t.Errorf("endpoint: %v", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if code := max(e.failDest[topic], e.failEvent[id]); code != 0 {
		http.Error(w, "fault injected", code)
		return
	}
	e.got[topic] = append(e.got[topic], sinktest.Delivered{ID: id, Key: h.Get(webhookwire.HeaderAggregateID), Type: typ, Payload: body, Headers: hdrs})
	w.WriteHeader(http.StatusNoContent)
}

func (e *endpoint) read(t *testing.T, dest string, want int) []sinktest.Delivered {
	t.Helper()
	n := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.got[dest])
	}
	deadline := time.Now().Add(10 * time.Second)
	for n() < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]sinktest.Delivered(nil), e.got[dest]...)
}

// The webhook publisher passes the sink suite against a real HTTP server
// with every fault: a destination answering 503 (retried, then handed
// back), one answering 403, one event answering 503, one answering 422,
// and a size limit.
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "webhook", New: webhookSink(nil)})
}

// With CloudEvents headers stamped, the publisher passes the same suite.
func TestSinkConformanceCloudEvents(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "webhook-cloudevents", New: webhookSink(&cloudevents.Config{Source: "urn:outbox:conformance"})})
}

func webhookSink(ce *cloudevents.Config) func(t *testing.T) *sinktest.Sink {
	return func(t *testing.T) *sinktest.Sink { return webhookSinkWith(t, ce) }
}

func webhookSinkWith(t *testing.T, ce *cloudevents.Config) *sinktest.Sink {
	t.Helper()
	e, srv := newEndpoint(t)
	pub, err := webhookpub.New(webhookpub.Config{Endpoint: srv.URL + "/hook", Secrets: e.secrets, MaxBytes: sinkMaxBytes, CloudEvents: ce,
		DeliveryTimeout: 3 * time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	fault := func(set func(), clear func()) func() {
		e.mu.Lock()
		set()
		e.mu.Unlock()
		return func() {
			e.mu.Lock()
			clear()
			e.mu.Unlock()
		}
	}
	return &sinktest.Sink{
		Sink:     pub,
		Read:     e.read,
		MaxBytes: sinkMaxBytes,
		FailDestination: func(_ *testing.T, dest string) func() {
			return fault(func() { e.failDest[dest] = http.StatusServiceUnavailable }, func() { delete(e.failDest, dest) })
		},
		RefuseDestination: func(_ *testing.T, dest string) {
			fault(func() { e.failDest[dest] = http.StatusForbidden }, func() {})
		},
		FailMessage: func(_ *testing.T, _ string, id int64) func() {
			return fault(func() { e.failEvent[id] = http.StatusServiceUnavailable }, func() { delete(e.failEvent, id) })
		},
		RefuseMessage: func(_ *testing.T, _ string, id int64) {
			fault(func() { e.failEvent[id] = http.StatusUnprocessableEntity }, func() {})
		},
	}
}
