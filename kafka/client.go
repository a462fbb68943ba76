package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Defaults of ClientConfig, applied by WithDefaults (and so by Options).
const (
	DefaultClientID    = "outbox"
	DefaultDialTimeout = 10 * time.Second
)

// ClientConfig says how to reach a cluster.
type ClientConfig struct {
	// Brokers are seed addresses, host:port. Required.
	Brokers []string
	// ClientID names the client in broker logs. Defaults to
	// DefaultClientID ("outbox").
	ClientID string
	// TLS enables TLS when true, with CAFile (PEM) added to the system
	// roots when set, and CertFile/KeyFile as the client certificate.
	TLS                       bool
	CAFile, CertFile, KeyFile string
	// TLSInsecureSkipVerify disables server certificate checks (testing
	// only). It needs TLS: without it the connection would be plaintext,
	// and Options refuses it.
	TLSInsecureSkipVerify bool
	// SASLMechanism is "", "PLAIN", "SCRAM-SHA-256" or "SCRAM-SHA-512".
	// PLAIN sends the password as it is: use it with TLS
	// (PlaintextPassword reports when it is not).
	SASLMechanism          string
	SASLUser, SASLPassword string
	// DialTimeout bounds one connection attempt. Defaults to
	// DefaultDialTimeout (10s).
	DialTimeout time.Duration
	// Logger receives a warning when a connection to a broker fails (the
	// first failure at once, then one line a minute per broker while it
	// stays unreachable) and a line when the broker is reached again.
	// franz-go retries by itself; without these lines an outage is silent
	// until a produce or fetch gives up. Defaults to slog.Default().
	Logger *slog.Logger
	// Opts are passed to kgo.NewClient after ours, so they win.
	Opts []kgo.Opt
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c ClientConfig) WithDefaults() ClientConfig {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first field of c that no client can connect with,
// saying what to set instead. The TLS files are read by Options.
func (c ClientConfig) Validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("kafka: no brokers; set ClientConfig.Brokers to at least one seed broker, host:port")
	}
	for _, b := range c.Brokers {
		if !strings.Contains(b, ":") {
			return fmt.Errorf("kafka: broker %q has no port; write it as host:port, e.g. %s:9092", b, b)
		}
	}
	if c.TLSInsecureSkipVerify && !c.tlsOn() {
		return errors.New("kafka: TLSInsecureSkipVerify is set but TLS is off, so the connection would be plaintext; set ClientConfig.TLS too, or drop TLSInsecureSkipVerify")
	}
	if (c.CertFile != "" || c.KeyFile != "") && (c.CertFile == "" || c.KeyFile == "") {
		return errors.New("kafka: a TLS client certificate needs both ClientConfig.CertFile and ClientConfig.KeyFile; set both, or neither")
	}
	if c.SASLMechanism != "" {
		if _, err := c.saslMechanism(); err != nil {
			return err
		}
	}
	return nil
}

// Options applies c's defaults, validates it and turns it into franz-go
// client options.
func (c ClientConfig) Options() ([]kgo.Opt, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.ClientID(c.ClientID), kgo.DialTimeout(c.DialTimeout), kgo.WithHooks(newConnLog(c.Logger))}
	if c.tlsOn() {
		tc, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if c.SASLMechanism != "" {
		m, err := c.saslMechanism()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(m))
	}
	return append(opts, c.Opts...), nil
}

// tlsOn reports whether the client connects over TLS: TLS, or a CA or
// client certificate given.
func (c ClientConfig) tlsOn() bool { return c.TLS || c.CAFile != "" || c.CertFile != "" }

// PlaintextPassword reports whether the configuration sends a SASL
// password in clear text: SASL PLAIN without TLS, which anyone on the
// path between client and broker can read.
func (c ClientConfig) PlaintextPassword() bool {
	return strings.EqualFold(c.SASLMechanism, "PLAIN") && !c.tlsOn()
}

func (c ClientConfig) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.TLSInsecureSkipVerify} //nolint:gosec // opt-in, for testing
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka: read TLS CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka: TLS CA file %s holds no PEM certificate", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka: load TLS client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func (c ClientConfig) saslMechanism() (sasl.Mechanism, error) {
	if c.SASLUser == "" {
		return nil, fmt.Errorf("kafka: SASL %s needs a user and password; set ClientConfig.SASLUser and ClientConfig.SASLPassword", c.SASLMechanism)
	}
	switch strings.ToUpper(c.SASLMechanism) {
	case "PLAIN":
		return plain.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return scram.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("kafka: SASL mechanism %q is not supported; use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", c.SASLMechanism)
}
