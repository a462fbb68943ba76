package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/kafka"
)

func ping(t *testing.T, cfg kafka.ClientConfig) error {
	t.Helper()
	opts, err := cfg.Options()
	require.NoError(t, err)
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

// The SASL settings reach a broker that requires them: each mechanism works
// with the right password and fails with a wrong one.
func TestSASLMechanismsAuthenticate(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			b, err := devkafka.Start(devkafka.Config{Opts: []kfake.Opt{
				kfake.EnableSASL(), kfake.Superuser(mech, "relay", "s3cret"),
			}})
			require.NoError(t, err)
			t.Cleanup(b.Close)
			cfg := kafka.ClientConfig{Brokers: []string{b.Addr()}, SASLMechanism: mech, SASLUser: "relay", SASLPassword: "s3cret", DialTimeout: 2 * time.Second}
			require.NoError(t, ping(t, cfg))

			cfg.SASLPassword = "wrong"
			err = ping(t, cfg)
			require.Error(t, err)
			require.NotContains(t, err.Error(), "wrong", "no secret in the error")
		})
	}
}

// Skipping certificate checks needs TLS: without it the client would
// connect in plaintext, silently.
func TestInsecureSkipVerifyWithoutTLSIsRefused(t *testing.T) {
	t.Parallel()
	_, err := kafka.ClientConfig{Brokers: []string{"h:9092"}, TLSInsecureSkipVerify: true}.Options()
	require.ErrorContains(t, err, "TLSInsecureSkipVerify is set but TLS is off, so the connection would be plaintext")
	_, err = kafka.ClientConfig{Brokers: []string{"h:9092"}, TLS: true, TLSInsecureSkipVerify: true}.Options()
	require.NoError(t, err)
}

// SASL PLAIN without TLS sends the password in clear: PlaintextPassword
// says so, for the CLI's warning; with TLS, or SCRAM, it does not.
func TestPlaintextPassword(t *testing.T) {
	t.Parallel()
	require.True(t, kafka.ClientConfig{SASLMechanism: "plain"}.PlaintextPassword())
	require.False(t, kafka.ClientConfig{SASLMechanism: "PLAIN", TLS: true}.PlaintextPassword())
	require.False(t, kafka.ClientConfig{SASLMechanism: "PLAIN", CAFile: "ca.pem"}.PlaintextPassword())
	require.False(t, kafka.ClientConfig{SASLMechanism: "SCRAM-SHA-512"}.PlaintextPassword())
}

func TestClientConfigWithDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	d := kafka.ClientConfig{}.WithDefaults()
	require.Equal(t, kafka.DefaultClientID, d.ClientID)
	require.Equal(t, kafka.DefaultDialTimeout, d.DialTimeout)
	require.NotNil(t, d.Logger)
	require.Equal(t, "mine", kafka.ClientConfig{ClientID: "mine"}.WithDefaults().ClientID)
	require.NoError(t, kafka.ClientConfig{Brokers: []string{"h:9092"}}.Validate())
	cases := []struct {
		cfg  kafka.ClientConfig
		want string
	}{
		{kafka.ClientConfig{}, "no brokers"},
		{kafka.ClientConfig{Brokers: []string{"localhost"}}, "has no port"},
		{kafka.ClientConfig{Brokers: []string{"h:9092"}, SASLMechanism: "GSSAPI", SASLUser: "u"}, "not supported"},
		{kafka.ClientConfig{Brokers: []string{"h:9092"}, SASLMechanism: "PLAIN"}, "needs a user"},
		{kafka.ClientConfig{Brokers: []string{"h:9092"}, CAFile: "/nonexistent/ca.pem"}, "read TLS CA file"},
		{kafka.ClientConfig{Brokers: []string{"h:9092"}, TLS: true, CertFile: "/x.pem"}, "needs both ClientConfig.CertFile and ClientConfig.KeyFile"},
		{kafka.ClientConfig{Brokers: []string{"h:9092"}, TLSInsecureSkipVerify: true}, "TLSInsecureSkipVerify is set but TLS is off"},
	}
	for _, tc := range cases {
		_, err := tc.cfg.Options()
		require.ErrorContains(t, err, tc.want)
		require.NotContains(t, err.Error(), "--", "a library error names config fields, not the CLI's flags")
		if tc.cfg.CAFile == "" {
			require.ErrorContains(t, tc.cfg.WithDefaults().Validate(), tc.want, "Validate")
		} else {
			require.NoError(t, tc.cfg.Validate(), "Validate does not read the TLS files")
		}
	}
}
