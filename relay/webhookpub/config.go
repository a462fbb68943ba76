package webhookpub

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"github.com/pgoutbox/outbox/internal/webhookwire"
	"github.com/pgoutbox/outbox/routing"
)

// Secret is one Standard Webhooks signing secret; see ParseSecrets. Its
// String never shows the key.
type Secret = webhookwire.Secret

// ParseSecrets reads one or more "whsec_" + base64 secrets separated by
// white space or commas. Every secret signs every request: during a
// rotation give the new and the old, so receivers holding either accept.
func ParseSecrets(s string) ([]Secret, error) { return webhookwire.ParseSecrets(s) }

// Defaults of Config.
const (
	DefaultConcurrency     = 16
	DefaultRequestTimeout  = 10 * time.Second
	DefaultDeliveryTimeout = 30 * time.Second
	DefaultMinBackoff      = 100 * time.Millisecond
	DefaultMaxBackoff      = 5 * time.Second
	DefaultMaxBytes        = routing.DefaultWebhookMaxBytes
)

// Config configures a Publisher.
type Config struct {
	// Endpoint is the URL (http or https) every event goes to unless a
	// route names another. Defaults to "": then every event needs a route,
	// and an event without one is held as relay.ReasonInvalidTopic.
	Endpoint string
	// Routes maps an event type ("order.placed") or a topic ("order") to
	// the URL of its endpoint; a type's route wins over its topic's, and
	// either over Endpoint. Defaults to none.
	Routes map[string]string
	// Secrets sign every request, one signature each (all of them: keep
	// two during a rotation). Required: at least one.
	Secrets []Secret
	// Source, when set, qualifies webhook-id ("source:42") and goes into
	// the outbox-event-source header. Defaults to "" (none).
	Source string
	// CloudEvents, when set, stamps every request with the CloudEvents
	// attributes of its event in the HTTP binding's binary mode: ce-
	// headers (ce-specversion, ce-id, ce-source, ce-type, ce-subject,
	// ce-time, ce-dataschema), values percent-encoded, with Content-Type
	// as datacontenttype (package cloudevents). They sit beside the
	// Standard Webhooks headers; the signature covers the body, not them.
	// Producers' routing.Webhook must then count them (CloudEvents).
	// Defaults to nil (no CloudEvents headers).
	CloudEvents *cloudevents.Config
	// MaxBytes is the largest request, body and headers; a larger event
	// is held as relay.ReasonTooLarge. Producers must use the same
	// (routing.Webhook.MaxBytes). Defaults to DefaultMaxBytes (1 MiB).
	MaxBytes int
	// Concurrency is how many requests one endpoint gets at a time,
	// across aggregates (an aggregate has one at a time). Defaults to
	// DefaultConcurrency (16).
	Concurrency int
	// RequestTimeout bounds one attempt, response included. Defaults to
	// DefaultRequestTimeout (10s).
	RequestTimeout time.Duration
	// DeliveryTimeout bounds how long one Publish call retries an event
	// before returning a retriable error (the relayer then backs off and
	// sends it again); the caller's context may end it sooner. Defaults to
	// DefaultDeliveryTimeout (30s).
	DeliveryTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between attempts (with full
	// jitter, doubling), unless the endpoint's Retry-After says otherwise.
	// Default to DefaultMinBackoff (100ms) and DefaultMaxBackoff (5s).
	MinBackoff, MaxBackoff time.Duration
	// CAFile is a PEM file of the certificate authorities https endpoints
	// are verified against, instead of the system's. Ignored when Client
	// is set. Defaults to "" (the system roots).
	CAFile string
	// Client sends the requests. Redirects are not followed whatever it
	// says. Defaults to a client that verifies TLS (CAFile's roots or the
	// system's) and keeps Concurrency idle connections per endpoint.
	Client *http.Client
	// Logger receives retries at debug level. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns cfg with its zero fields set to their defaults
// (Client excepted: New builds it, as it may read CAFile).
func (cfg Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	def(&cfg.RequestTimeout, DefaultRequestTimeout)
	def(&cfg.DeliveryTimeout, DefaultDeliveryTimeout)
	def(&cfg.MinBackoff, DefaultMinBackoff)
	def(&cfg.MaxBackoff, DefaultMaxBackoff)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Validate reports the first field of cfg a Publisher cannot use, saying
// what to set instead.
func (cfg Config) Validate() error {
	if len(cfg.Secrets) == 0 {
		return errors.New("webhookpub: Secrets is empty; give at least one \"whsec_\" secret (ParseSecrets)")
	}
	if cfg.Endpoint == "" && len(cfg.Routes) == 0 {
		return errors.New("webhookpub: set Endpoint (the URL every event goes to) or Routes (type or topic -> URL)")
	}
	if cfg.Endpoint != "" {
		if err := checkURL(cfg.Endpoint); err != nil {
			return fmt.Errorf("webhookpub: Endpoint: %w", err)
		}
	}
	for k, u := range cfg.Routes {
		if k == "" {
			return errors.New("webhookpub: Routes has an empty key; key a route by event type or topic")
		}
		if err := checkURL(u); err != nil {
			return fmt.Errorf("webhookpub: Routes[%q]: %w", k, err)
		}
	}
	if cfg.CloudEvents != nil {
		if err := cfg.CloudEvents.Validate(); err != nil {
			return fmt.Errorf("webhookpub: CloudEvents: %w", err)
		}
	}
	if len(cfg.Source) > outbox.MaxSourceLen || pgtext.Invalid(cfg.Source) != "" {
		return fmt.Errorf("webhookpub: Source: use at most %d bytes of UTF-8 text without NUL", outbox.MaxSourceLen)
	}
	switch {
	case cfg.MaxBytes < 0:
		return fmt.Errorf("webhookpub: MaxBytes is %d; use a positive size in bytes, or 0 for %d", cfg.MaxBytes, DefaultMaxBytes)
	case cfg.MaxBytes > 0 && cfg.MaxBytes < minRequest(len(cfg.Secrets)):
		return fmt.Errorf("webhookpub: MaxBytes (the sink URL's max_bytes) is %d; the smallest event makes a request of %d bytes, so use at least that, or 0 for %d", cfg.MaxBytes, minRequest(len(cfg.Secrets)), DefaultMaxBytes)
	case cfg.Concurrency < 0:
		return fmt.Errorf("webhookpub: Concurrency is %d; use a positive number, or 0 for %d", cfg.Concurrency, DefaultConcurrency)
	case cfg.RequestTimeout < 0 || cfg.DeliveryTimeout < 0 || cfg.MinBackoff < 0 || cfg.MaxBackoff < 0:
		return errors.New("webhookpub: RequestTimeout, DeliveryTimeout, MinBackoff and MaxBackoff must not be negative (0 for their defaults)")
	case cfg.MaxBackoff != 0 && cfg.MinBackoff > cfg.MaxBackoff:
		return fmt.Errorf("webhookpub: MinBackoff %s is above MaxBackoff %s", cfg.MinBackoff, cfg.MaxBackoff)
	}
	return nil
}

// checkURL refuses what cannot be an endpoint.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL", redact(raw))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q: write http://host[:port]/path or https://host[:port]/path", redact(raw))
	}
	if u.User != nil {
		return fmt.Errorf("%q carries credentials; endpoints authenticate requests by their signatures", redact(raw))
	}
	return nil
}

// redact is raw without what may be a secret: a password, the query
// (tokens often travel there) and the fragment.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable URL>"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// newClient is Config.Client's default.
func newClient(cfg Config) (*http.Client, error) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("webhookpub: CAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("webhookpub: CAFile %s holds no PEM certificate", cfg.CAFile)
		}
		tlsCfg.RootCAs = pool
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	tr.MaxIdleConnsPerHost = cfg.Concurrency
	return &http.Client{Transport: tr}, nil
}

// minRequest is the request of the smallest event, signed nsig times.
func minRequest(nsig int) int { return routing.Webhook{Signatures: nsig}.Size("x", 2, nil) }
