package webhookconsumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer/webhookconsumer"
	"github.com/pgoutbox/outbox/internal/npmtest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/webhookpub"
)

// Two secrets of the tests (not real ones): the new and the old of a
// rotation.
const (
	secretNew = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretOld = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
)

type signedCase struct {
	ID        string `json:"id"`
	Timestamp int64  `json:"timestamp"`
	Signature string `json:"signature,omitempty"`
	Body      string `json:"body"`
}

type interopOut struct {
	Verified []any    `json:"verified"`
	Signed   []string `json:"signed"`
}

// standardWebhooks installs the npm standardwebhooks library in a
// directory of the test's own and returns a func running the interop
// script with it.
func standardWebhooks(t *testing.T) func(secret string, verify, sign []signedCase) interopOut {
	t.Helper()
	dir, node := npmtest.Install(t, npmtest.Files(t, filepath.Join("testdata", "interop"), "package.json", "interop.js"),
		"the standardwebhooks interop")
	return func(secret string, verify, sign []signedCase) interopOut {
		in, err := json.Marshal(map[string]any{"secret": secret, "verify": verify, "sign": sign})
		require.NoError(t, err)
		cmd := exec.Command(node, "interop.js")
		cmd.Dir, cmd.Stdin = dir, bytes.NewReader(in)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		raw, err := cmd.Output()
		require.NoError(t, err, "node interop.js: %s", stderr.String())
		var res interopOut
		require.NoError(t, json.Unmarshal(raw, &res), string(raw))
		return res
	}
}

// capture sends events through the webhook sink, signed with both
// secrets of a rotation, and returns the requests as they arrived.
func capture(t *testing.T, payloads []string) []signedCase {
	t.Helper()
	var mu sync.Mutex
	var got []signedCase
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ts, _ := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64)
		mu.Lock()
		got = append(got, signedCase{ID: r.Header.Get("webhook-id"), Timestamp: ts, Signature: r.Header.Get("webhook-signature"), Body: string(body)})
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	secrets, err := webhookpub.ParseSecrets(secretNew + " " + secretOld)
	require.NoError(t, err)
	pub, err := webhookpub.New(webhookpub.Config{Endpoint: srv.URL, Secrets: secrets, Source: "billing eu"})
	require.NoError(t, err)
	agg := uuid.New()
	var msgs []relay.Message
	for i, p := range payloads {
		msgs = append(msgs, relay.Message{ID: int64(i + 1), AggregateID: agg, Type: "order.placed", Topic: "order", Payload: []byte(p)})
	}
	for _, err := range pub.Publish(context.Background(), msgs) {
		require.NoError(t, err)
	}
	return got
}

var payloads = []string{`{}`, `{"name": "Zoë — 東京 🚀", "html": "<b>a & b</b>"}`, `{"a": [1, 2, {"c": null}], "d": 1.50}`}

// The npm standardwebhooks library accepts the signatures the relay
// sends, with either secret of a rotation, and refuses a tampered body,
// a wrong id and a wrong secret.
func TestStandardWebhooksAcceptsOurSignatures(t *testing.T) {
	t.Parallel()
	theirs := standardWebhooks(t)
	sent := capture(t, payloads)
	require.Len(t, sent, len(payloads))
	bad := []signedCase{sent[0], sent[1]}
	bad[0].Body = `{"tampered": true}`
	bad[1].ID = "billing:999"
	for _, secret := range []string{secretNew, secretOld} {
		res := theirs(secret, append(append([]signedCase(nil), sent...), bad...), nil)
		for i := range sent {
			require.Equal(t, true, res.Verified[i], "their library on our request %+v", sent[i])
		}
		for i := range bad {
			require.NotEqual(t, true, res.Verified[len(sent)+i], "their library must refuse %+v", bad[i])
		}
	}
	res := theirs("whsec_"+"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", sent, nil)
	for i := range sent {
		require.NotEqual(t, true, res.Verified[i], "a secret the relay does not hold")
	}
}

// Our Verifier accepts what the npm standardwebhooks library signs, and
// refuses it tampered, too old, or under another secret.
func TestOurVerifierAcceptsStandardWebhooks(t *testing.T) {
	t.Parallel()
	theirs := standardWebhooks(t)
	now := time.Now().Unix()
	var cases []signedCase
	for i, p := range payloads {
		cases = append(cases, signedCase{ID: "msg_" + strconv.Itoa(i), Timestamp: now, Body: p})
	}
	res := theirs(secretOld, nil, cases)
	require.Len(t, res.Signed, len(cases))
	both, err := webhookconsumer.ParseSecrets(secretNew + "," + secretOld)
	require.NoError(t, err)
	onlyNew, err := webhookconsumer.ParseSecrets(secretNew)
	require.NoError(t, err)
	v, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: both})
	require.NoError(t, err)
	vNew, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: onlyNew})
	require.NoError(t, err)
	for i, c := range cases {
		h := http.Header{}
		h.Set("webhook-id", c.ID)
		h.Set("webhook-timestamp", strconv.FormatInt(c.Timestamp, 10))
		h.Set("webhook-signature", res.Signed[i])
		require.NoError(t, v.Verify(h, []byte(c.Body)), "our verifier on their signature %q", res.Signed[i])
		require.ErrorIs(t, vNew.Verify(h, []byte(c.Body)), webhookconsumer.ErrNoMatch, "signed with the old secret only")
		require.ErrorIs(t, v.Verify(h, []byte(c.Body+" ")), webhookconsumer.ErrNoMatch, "tampered")
		h.Set("webhook-timestamp", strconv.FormatInt(c.Timestamp-600, 10))
		require.ErrorIs(t, v.Verify(h, []byte(c.Body)), webhookconsumer.ErrTooOld)
	}
}
