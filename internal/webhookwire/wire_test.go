package webhookwire

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func secrets(t *testing.T, s ...string) []Secret {
	t.Helper()
	out, err := ParseSecrets(strings.Join(s, " "))
	require.NoError(t, err)
	return out
}

const (
	secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
)

func TestSignVerify(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	ts := fmt.Sprint(now.Unix())
	body := []byte(`{"n": 1}`)
	a, b := secrets(t, secretA), secrets(t, secretB)
	sig := Sign(a, "42", now.Unix(), body)
	require.Regexp(t, `^v1,[A-Za-z0-9+/]{43}=$`, sig)
	require.NoError(t, Verify(a, "42", ts, sig, body, now, 5*time.Minute))
	require.ErrorIs(t, Verify(b, "42", ts, sig, body, now, 5*time.Minute), ErrNoMatch)
	require.ErrorIs(t, Verify(a, "43", ts, sig, body, now, 5*time.Minute), ErrNoMatch, "the id is signed")
	require.ErrorIs(t, Verify(a, "42", ts, sig, []byte(`{"n": 2}`), now, 5*time.Minute), ErrNoMatch, "the body is signed")
	require.ErrorIs(t, Verify(a, "42", fmt.Sprint(now.Unix()+1), sig, body, now, 5*time.Minute), ErrNoMatch, "the timestamp is signed")
	require.ErrorIs(t, Verify(a, "42", ts, sig, body, now.Add(6*time.Minute), 5*time.Minute), ErrTooOld)
	require.ErrorIs(t, Verify(a, "42", ts, sig, body, now.Add(-6*time.Minute), 5*time.Minute), ErrTooNew)
	require.ErrorIs(t, Verify(a, "42", "soon", sig, body, now, 5*time.Minute), ErrBadTimestamp)
	require.ErrorIs(t, Verify(a, "", ts, sig, body, now, 5*time.Minute), ErrMissingHeaders)
	require.ErrorIs(t, Verify(a, "42", ts, "v2,"+sig[3:], body, now, 5*time.Minute), ErrNoMatch, "only v1 counts")

	// Rotation: both sign; a receiver holding either accepts, and one
	// holding both accepts a request signed by either.
	both := secrets(t, secretA, secretB)
	sig2 := Sign(both, "42", now.Unix(), body)
	require.Len(t, strings.Fields(sig2), 2)
	require.NoError(t, Verify(a, "42", ts, sig2, body, now, 5*time.Minute))
	require.NoError(t, Verify(b, "42", ts, sig2, body, now, 5*time.Minute))
	require.NoError(t, Verify(both, "42", ts, Sign(b, "42", now.Unix(), body), body, now, 5*time.Minute))
}

func TestParseSecret(t *testing.T) {
	t.Parallel()
	s, err := ParseSecret(secretA)
	require.NoError(t, err)
	require.NotContains(t, fmt.Sprint(s), "MfKQ", "String hides the key")
	require.NotContains(t, fmt.Sprintf("%#v %+v", s, s), "MfKQ")
	_, err = ParseSecret(strings.TrimPrefix(secretA, SecretPrefix))
	require.NoError(t, err, "the prefix is optional")
	_, err = ParseSecret("whsec_not base64!")
	require.ErrorContains(t, err, "base64")
	_, err = ParseSecret("whsec_" + base64.StdEncoding.EncodeToString([]byte("short")))
	require.ErrorContains(t, err, "at least 16")
	_, err = ParseSecrets(" , ")
	require.ErrorContains(t, err, "no secret")
	_, err = ParseSecrets(secretA + ",whsec_!!")
	require.ErrorContains(t, err, "secret 2 of 2")
}

func TestHeaderCodecRoundTrips(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "traceparent", "X-Foo", "space in name", "ключ", "100%", " padded ", "tab\there", "a\r\nb", "Grüße 🚀", "\x7f", "~!#$&'*+-.^_`|"} {
		n, v := EncodeName(s), EncodeValue(s)
		for i := 0; i < len(n); i++ {
			require.True(t, nameByteOK(n[i]) || n[i] == '%' || n[i] >= 'A' && n[i] <= 'F', "name %q encodes to %q", s, n)
		}
		require.NotContains(t, v, "\r")
		require.False(t, strings.HasPrefix(v, " ") || strings.HasSuffix(v, " "), "value %q has edge spaces: %q", s, v)
		got, err := Decode(strings.ToLower(n))
		require.NoError(t, err)
		require.Equal(t, s, got, "name %q via %q", s, n)
		got, err = Decode(v)
		require.NoError(t, err)
		require.Equal(t, s, got, "value %q via %q", s, v)
	}
	require.Equal(t, "traceparent", EncodeName("traceparent"))
	require.Equal(t, "a b", EncodeValue("a b"))
	require.Equal(t, "Gr%C3%BC%C3%9Fe", EncodeValue("Grüße"))
	_, err := Decode("bad%4")
	require.Error(t, err)
	_, err = Decode("bad%zz")
	require.Error(t, err)
}

func TestReserved(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"host", "content-length", "webhook-id", "outbox-event-id", "aggregate_id", "proxy-authorization"} {
		_, bad := Reserved(n)
		require.True(t, bad, n)
	}
	for _, n := range []string{"traceparent", "Host", "tenant", "Content-Length"} {
		_, bad := Reserved(n)
		require.False(t, bad, "%s travels as %s, which is no HTTP header of its own", n, EncodeName(n))
	}
}

func TestEventHeaders(t *testing.T) {
	t.Parallel()
	got, err := EventHeaders(map[string][]string{
		"Traceparent": {"00-ab-01"}, "%58-%46oo": {"x"}, "Content-Type": {"application/json"},
		"Webhook-Id": {"1"}, "Outbox-Event-Id": {"1"}, "User-Agent": {"Go"}, "Empty": {""},
	})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"traceparent": "00-ab-01", "X-Foo": "x", "empty": ""}, got)
}

func TestMessageID(t *testing.T) {
	t.Parallel()
	require.Equal(t, "42", MessageID("", 42))
	require.Equal(t, "billing:42", MessageID("billing", 42))
	require.Equal(t, "a%0Ab:42", MessageID("a\nb", 42))
}
