package webhookpub_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/webhookpub"
)

func secrets(t *testing.T) []webhookpub.Secret {
	t.Helper()
	s, err := webhookpub.ParseSecrets(testSecret)
	require.NoError(t, err)
	return s
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	sec := secrets(t)
	for _, c := range []struct {
		cfg  webhookpub.Config
		want string
	}{
		{webhookpub.Config{Endpoint: "http://h/x"}, "Secrets is empty"},
		{webhookpub.Config{Secrets: sec}, "set Endpoint"},
		{webhookpub.Config{Secrets: sec, Endpoint: "ftp://h/x"}, "http://host"},
		{webhookpub.Config{Secrets: sec, Endpoint: "https://u:pw@h/x"}, "credentials"},
		{webhookpub.Config{Secrets: sec, Routes: map[string]string{"order": "h/x"}}, `Routes["order"]`},
		{webhookpub.Config{Secrets: sec, Routes: map[string]string{"": "http://h/x"}}, "empty key"},
		{webhookpub.Config{Secrets: sec, Endpoint: "http://h/x", MaxBytes: -1}, "MaxBytes is -1"},
		{webhookpub.Config{Secrets: sec, Endpoint: "http://h/x", MaxBytes: 100}, "max_bytes) is 100; the smallest event"},
		{webhookpub.Config{Secrets: sec, Endpoint: "http://h/x", Concurrency: -2}, "Concurrency is -2"},
		{webhookpub.Config{Secrets: sec, Endpoint: "http://h/x", MinBackoff: time.Second, MaxBackoff: time.Millisecond}, "MinBackoff"},
		{webhookpub.Config{Secrets: sec, Endpoint: "http://h/x", CAFile: "/nonexistent/ca.pem"}, "CAFile"},
	} {
		_, err := webhookpub.New(c.cfg)
		require.ErrorContains(t, err, c.want)
		require.NotContains(t, err.Error(), "pw", "no password in errors")
	}
	_, err := webhookpub.New(webhookpub.Config{Secrets: sec, Endpoint: "https://h/x?token=s3cr3t", Routes: map[string]string{"a": "bad"}})
	require.NotContains(t, err.Error(), "s3cr3t")
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	require.Equal(t, 2*time.Second, webhookpub.RetryAfter("2", now))
	require.Equal(t, 30*time.Second, webhookpub.RetryAfter(now.Add(30*time.Second).Format(http.TimeFormat), now))
	require.Equal(t, time.Duration(0), webhookpub.RetryAfter(now.Add(-time.Minute).Format(http.TimeFormat), now))
	require.Equal(t, time.Hour, webhookpub.RetryAfter("999999", now))
	for _, none := range []string{"", "soon", "-1"} {
		require.Equal(t, time.Duration(-1), webhookpub.RetryAfter(none, now), none)
	}
}

func publisher(t *testing.T, h http.Handler, cfg webhookpub.Config) *webhookpub.Publisher {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	cfg.Endpoint, cfg.Secrets = srv.URL, secrets(t)
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 5*time.Millisecond, 20*time.Millisecond
	}
	p, err := webhookpub.New(cfg)
	require.NoError(t, err)
	return p
}

func one(t *testing.T, p *webhookpub.Publisher) error {
	t.Helper()
	errs := p.Publish(context.Background(), []relay.Message{{ID: 1, AggregateID: uuid.New(), Type: "order.placed", Topic: "order", Payload: []byte(`{}`)}})
	require.Len(t, errs, 1)
	return errs[0]
}

// Statuses a retry cannot change hold the event with the right reason;
// the others are retried within the call until they go through.
func TestStatuses(t *testing.T) {
	t.Parallel()
	for code, reason := range map[int]string{400: relay.ReasonBrokerRefused, 404: relay.ReasonBrokerRefused, 422: relay.ReasonBrokerRefused,
		401: relay.ReasonNotAuthorized, 403: relay.ReasonNotAuthorized, 413: relay.ReasonTooLarge, 301: relay.ReasonBrokerRefused} {
		var calls atomic.Int32
		p := publisher(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.Header().Set("Location", "/elsewhere")
			http.Error(w, "no thanks", code)
		}), webhookpub.Config{})
		err := one(t, p)
		require.True(t, relay.IsPermanent(err), "%d: %v", code, err)
		require.Equal(t, reason, relay.ReasonOf(err), "%d", code)
		require.Contains(t, err.Error(), http.StatusText(code))
		require.EqualValues(t, 1, calls.Load(), "%d is not retried", code)
	}
	for _, code := range []int{408, 429, 500, 502, 503} {
		var calls atomic.Int32
		p := publisher(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) < 3 {
				http.Error(w, "later", code)
			}
		}), webhookpub.Config{})
		require.NoError(t, one(t, p), "%d is retried", code)
		require.EqualValues(t, 3, calls.Load(), "%d", code)
	}
}

// A 429's Retry-After is waited for; when it reaches past the delivery
// timeout, the event is handed back (retriable) without waiting.
func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var at []time.Time
	p := publisher(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		at = append(at, time.Now())
		if len(at) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}), webhookpub.Config{})
	require.NoError(t, one(t, p))
	require.Len(t, at, 2)
	require.GreaterOrEqual(t, at[1].Sub(at[0]), time.Second, "waited for Retry-After")

	p = publisher(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
	}), webhookpub.Config{DeliveryTimeout: 2 * time.Second})
	start := time.Now()
	err := one(t, p)
	require.Error(t, err)
	require.False(t, relay.IsPermanent(err))
	require.Equal(t, "http_429", p.ErrorCode(err))
	require.Less(t, time.Since(start), time.Minute, "did not sleep an hour")
}

// An endpoint that does not answer in time is retried, then the event is
// handed back as retriable with code timeout.
func TestTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	p := publisher(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}), webhookpub.Config{RequestTimeout: 100 * time.Millisecond, DeliveryTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for its handlers
	err := one(t, p)
	require.Error(t, err)
	require.False(t, relay.IsPermanent(err))
	require.Equal(t, "timeout", p.ErrorCode(err))
}

// At most Concurrency requests reach an endpoint at once, and never two
// of one aggregate; each aggregate's arrive in order.
func TestConcurrencyBounds(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		inFlight int
		peak     int
		perAgg   = map[string]int{}
		order    = map[string][]string{}
	)
	p := publisher(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		agg := r.Header.Get("outbox-aggregate-id")
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		perAgg[agg]++
		if perAgg[agg] > 1 {
			t.Errorf("two requests of aggregate %s at once", agg)
		}
		order[agg] = append(order[agg], r.Header.Get("outbox-event-id"))
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		inFlight--
		perAgg[agg]--
		mu.Unlock()
	}), webhookpub.Config{Concurrency: 3})
	aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()}
	var msgs []relay.Message
	want := map[string][]string{}
	for i := range 60 {
		a := aggs[i%len(aggs)]
		id := int64(i + 1)
		msgs = append(msgs, relay.Message{ID: id, AggregateID: a, Type: "order.placed", Topic: "order", Payload: []byte(`{}`)})
		want[a.String()] = append(want[a.String()], strconv.FormatInt(id, 10))
	}
	for _, err := range p.Publish(context.Background(), msgs) {
		require.NoError(t, err)
	}
	require.LessOrEqual(t, peak, 3)
	require.Equal(t, want, order)
}

// Ready fails while an endpoint keeps failing for a whole publish, and
// passes again once a publish goes through.
func TestReady(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	down.Store(true)
	p := publisher(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}), webhookpub.Config{DeliveryTimeout: 2 * time.Second})
	require.NoError(t, p.Ready(context.Background()), "nothing published yet")
	require.Error(t, one(t, p))
	require.ErrorContains(t, p.Ready(context.Background()), "publishing has failed since")
	down.Store(false)
	require.NoError(t, one(t, p))
	require.NoError(t, p.Ready(context.Background()))
}
