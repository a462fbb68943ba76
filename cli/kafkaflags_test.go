package cli

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
)

// --tls-insecure only skips the certificate check of a TLS connection:
// alone it would connect in plaintext, so it is refused before anything
// is dialed.
func TestTLSInsecureWithoutTLSIsRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	for _, cmd := range [][]string{{"relay"}, {"consume", "--topics", "order"}} {
		code, _, stderr := runCLI(t, db, append(cmd, "--brokers", "127.0.0.1:1", "--tls-insecure")...)
		require.Equal(t, 1, code, stderr)
		require.Contains(t, stderr, "--tls-insecure without --tls would connect in plaintext: add --tls", cmd)
		require.NotContains(t, stderr, "cannot reach Kafka", "refused before dialing")
	}
}

// SASL PLAIN without TLS sends the password in clear: the command warns,
// naming the brokers and the user, never the password.
func TestSASLPlainWithoutTLSWarns(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	const password = "hunter2-secret"
	code, _, stderr := runCLI(t, db, "relay", "--brokers", "127.0.0.1:1", "--sasl-mechanism", "PLAIN", "--sasl-user", "alice", "--sasl-password", password)
	require.Equal(t, 1, code) // nothing listens on port 1
	require.Contains(t, stderr, "level=WARN msg=\"SASL PLAIN without TLS sends the Kafka password in clear text")
	require.Contains(t, stderr, "sasl_user=alice")
	require.NotContains(t, stderr, password)

	code, _, stderr = runCLI(t, db, "relay", "--brokers", "127.0.0.1:1", "--tls", "--sasl-mechanism", "PLAIN", "--sasl-user", "alice", "--sasl-password", password)
	require.Equal(t, 1, code)
	require.NotContains(t, stderr, "SASL PLAIN without TLS")
}
