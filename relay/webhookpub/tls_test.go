package webhookpub_test

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/webhookpub"
)

// TLS is verified: an endpoint whose certificate no trusted CA signed is
// not sent to (a retriable error, code tls, and Ping says so), and CAFile
// makes its CA trusted.
func TestTLSVerified(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))

	untrusted, err := webhookpub.New(webhookpub.Config{Endpoint: srv.URL, Secrets: secrets(t),
		DeliveryTimeout: 3 * time.Second, MinBackoff: 10 * time.Second, MaxBackoff: 10 * time.Second}) // one attempt: its error, not a deadline
	require.NoError(t, err)
	err = one(t, untrusted)
	require.Error(t, err)
	require.False(t, relay.IsPermanent(err))
	require.Equal(t, "tls", untrusted.ErrorCode(err), "%v", err)
	require.ErrorContains(t, untrusted.Ping(context.Background()), "certificate")

	trusted, err := webhookpub.New(webhookpub.Config{Endpoint: srv.URL, Secrets: secrets(t), CAFile: ca})
	require.NoError(t, err)
	require.NoError(t, one(t, trusted))
	require.NoError(t, trusted.Ping(context.Background()))

	bad := filepath.Join(t.TempDir(), "bad.pem")
	require.NoError(t, os.WriteFile(bad, []byte("not a certificate"), 0o600))
	_, err = webhookpub.New(webhookpub.Config{Endpoint: srv.URL, Secrets: secrets(t), CAFile: bad})
	require.ErrorContains(t, err, "holds no PEM certificate")
}
