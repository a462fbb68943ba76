package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/webhookwire"
)

const testWebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	return p
}

func TestWebhookSinkURL(t *testing.T) {
	t.Parallel()
	secret := writeFile(t, "secret", testWebhookSecret+"\nwhsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD\n")
	routes := writeFile(t, "routes", "# routes\norder.placed https://a.example/orders\npayment  https://b.example/pay # payments\n\n")
	raw := "https://hooks.example/outbox?token=abc&secret_file=" + url.QueryEscape(secret) + "&routes=" + url.QueryEscape(routes) +
		"&max_bytes=5000&concurrency=4&request_timeout=3s"
	u, err := url.Parse(raw)
	require.NoError(t, err)
	cfg, err := webhookConfig(u, sinkEnv{log: slog.Default(), source: "billing", deliver: 7 * time.Second})
	require.NoError(t, err)
	require.Equal(t, "https://hooks.example/outbox?token=abc", cfg.Endpoint, "the relay's options leave the endpoint's URL, its own stay")
	require.Equal(t, map[string]string{"order.placed": "https://a.example/orders", "payment": "https://b.example/pay"}, cfg.Routes)
	require.Len(t, cfg.Secrets, 2, "both secrets of a rotation sign")
	require.Equal(t, 5000, cfg.MaxBytes)
	require.Equal(t, 4, cfg.Concurrency)
	require.Equal(t, 3*time.Second, cfg.RequestTimeout)
	require.Equal(t, 7*time.Second, cfg.DeliveryTimeout)
	require.Equal(t, "billing", cfg.Source)

	star := writeFile(t, "star", "* https://c.example/all\n")
	u, _ = url.Parse("https://hooks.example/x?secret_file=" + url.QueryEscape(secret) + "&routes=" + url.QueryEscape(star))
	cfg, err = webhookConfig(u, sinkEnv{log: slog.Default()})
	require.NoError(t, err)
	require.Equal(t, "https://c.example/all", cfg.Endpoint, "* in the routes file is the default endpoint")

	none := writeFile(t, "none", "order https://a.example/orders\n* -\n")
	u, _ = url.Parse("https://hooks.example/x?secret_file=" + url.QueryEscape(secret) + "&routes=" + url.QueryEscape(none))
	cfg, err = webhookConfig(u, sinkEnv{log: slog.Default()})
	require.NoError(t, err)
	require.Empty(t, cfg.Endpoint, "* - leaves no default endpoint")
}

func TestWebhookSinkURLMistakes(t *testing.T) {
	t.Parallel()
	secret := writeFile(t, "secret", testWebhookSecret)
	badRoutes := writeFile(t, "routes", "order.placed\n")
	dupRoutes := writeFile(t, "dup", "a http://x/1\na http://x/2\n")
	sf := "secret_file=" + url.QueryEscape(secret)
	for raw, want := range map[string]string{
		"https://h/x?secret=whsec_abc&" + sf:                                          "secrets never go in the URL",
		"https://u:pw@h/x?" + sf:                                                      "takes no user or password",
		"https://h/x?max_bytes=lots&" + sf:                                            "max_bytes=\"lots\"",
		"https://h/x?concurrency=0&" + sf:                                             "concurrency=\"0\"",
		"https://h/x?request_timeout=soon&" + sf:                                      "request_timeout",
		"https://h/x?routes=/nonexistent&" + sf:                                       "routes",
		"https://h/x?routes=" + url.QueryEscape(badRoutes) + "&" + sf:                 "line 1",
		"https://h/x?routes=" + url.QueryEscape(dupRoutes) + "&" + sf:                 "routed twice",
		"https://h/x?secret_file=/nonexistent":                                        "secret_file",
		"https://h/x?secret_file=" + url.QueryEscape(writeFile(t, "empty", "\n")):     "OUTBOX_WEBHOOK_SECRET",
		"https://h/x?secret_file=" + url.QueryEscape(writeFile(t, "bad", "whsec_!!")): "base64",
	} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		_, err = openWebhookURL(context.Background(), u, sinkEnv{log: slog.Default(), deliver: time.Second})
		require.ErrorContains(t, err, want, raw)
		require.NotContains(t, err.Error(), "pw")
		require.NotContains(t, err.Error(), "MfKQ9r8", "no secret in errors")
	}
}

// `outbox relay --sink http://...` drains the outbox to the endpoint,
// every request signed, and logs no secret.
func TestRelayWebhookSinkPublishes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	secrets, err := webhookwire.ParseSecrets(testWebhookSecret)
	require.NoError(t, err)
	var mu sync.Mutex
	got := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h := r.Header
		if err := webhookwire.Verify(secrets, h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature"), body, time.Now(), time.Minute); err != nil {
			t.Errorf("signature: %v", err)
		}
		mu.Lock()
		got++
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	_, err = db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) SELECT gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, 50)")
	require.NoError(t, err)

	var out bytes.Buffer
	root := NewRoot(&out, &out)
	sink := srv.URL + "/hook?secret_file=" + url.QueryEscape(writeFile(t, "secret", testWebhookSecret))
	root.SetArgs([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--sink", sink, "--poll-interval", "50ms", "--log-level", "debug"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL").Scan(&n))
		return n == 0
	}, 30*time.Second, 50*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 50, got)
	require.NotContains(t, out.String(), "MfKQ9r8", "no secret in the relay's output")
}
