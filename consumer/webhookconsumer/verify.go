package webhookconsumer

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/internal/webhookwire"
)

// Secret is one Standard Webhooks secret; see ParseSecrets. Its String
// never shows the key.
type Secret = webhookwire.Secret

// ParseSecrets reads one or more "whsec_" + base64 secrets separated by
// white space or commas. A request signed by any of them is accepted:
// during a rotation, hold the new and the old.
func ParseSecrets(s string) ([]Secret, error) { return webhookwire.ParseSecrets(s) }

// DefaultTolerance is how far a request's webhook-timestamp may be from
// now, either way, by default: the Standard Webhooks libraries' 5 minutes.
const DefaultTolerance = 5 * time.Minute

// Errors Verify returns (wrapped), for the caller's status and logs.
var (
	ErrMissingHeaders = webhookwire.ErrMissingHeaders
	ErrBadTimestamp   = webhookwire.ErrBadTimestamp
	ErrTooOld         = webhookwire.ErrTooOld
	ErrTooNew         = webhookwire.ErrTooNew
	ErrNoMatch        = webhookwire.ErrNoMatch
)

// VerifierConfig configures a Verifier.
type VerifierConfig struct {
	// Secrets are the secrets a signature may match. Required: at least
	// one.
	Secrets []Secret
	// Tolerance is how far webhook-timestamp may be from now, either way;
	// it bounds how long a captured request can be replayed. Defaults to
	// DefaultTolerance (5m).
	Tolerance time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg VerifierConfig) WithDefaults() VerifierConfig {
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultTolerance
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

// Validate reports the first field of cfg a Verifier cannot use.
func (cfg VerifierConfig) Validate() error {
	if len(cfg.Secrets) == 0 {
		return errors.New("webhookconsumer: Secrets is empty; give the relay's \"whsec_\" secret (ParseSecrets)")
	}
	if cfg.Tolerance < 0 {
		return fmt.Errorf("webhookconsumer: Tolerance is %s; use a positive duration, or 0 for %s", cfg.Tolerance, DefaultTolerance)
	}
	return nil
}

// Verifier checks Standard Webhooks signatures: the timestamp within
// the tolerance, and one of the request's v1 signatures matching one of
// the secrets, compared in constant time.
type Verifier struct{ cfg VerifierConfig }

// NewVerifier checks cfg (after WithDefaults) and builds a Verifier.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Verifier{cfg: cfg}, nil
}

// Verify checks the signature of a request with headers h and body,
// byte for byte as received.
func (v *Verifier) Verify(h http.Header, body []byte) error {
	return webhookwire.Verify(v.cfg.Secrets, h.Get(webhookwire.HeaderID), h.Get(webhookwire.HeaderTimestamp),
		h.Get(webhookwire.HeaderSignature), body, v.cfg.Now(), v.cfg.Tolerance)
}

// Event is an outbox event as a webhook request carries it.
type Event struct {
	// WebhookID is webhook-id: the event id qualified by its source.
	WebhookID string
	// ID is the event id (outbox-event-id).
	ID int64
	// Source is the relayer's event_source, "" when it has none.
	Source      string
	Type        string
	Topic       string
	AggregateID uuid.UUID
	// Headers are the event's own headers, decoded.
	Headers map[string]string
	// Payload is the body.
	Payload []byte
}

// ReadEvent reads the outbox event of a request (verify it first).
func ReadEvent(h http.Header, body []byte) (Event, error) {
	e := Event{WebhookID: h.Get(webhookwire.HeaderID), Payload: body}
	var err error
	if e.ID, err = strconv.ParseInt(h.Get(webhookwire.HeaderEventID), 10, 64); err != nil || e.ID <= 0 {
		return e, fmt.Errorf("webhookconsumer: %s %q is not an event id", webhookwire.HeaderEventID, h.Get(webhookwire.HeaderEventID))
	}
	if e.AggregateID, err = uuid.Parse(h.Get(webhookwire.HeaderAggregateID)); err != nil {
		return e, fmt.Errorf("webhookconsumer: %s %q is not a UUID", webhookwire.HeaderAggregateID, h.Get(webhookwire.HeaderAggregateID))
	}
	for _, f := range []struct {
		dst  *string
		name string
	}{{&e.Type, webhookwire.HeaderEventType}, {&e.Topic, webhookwire.HeaderTopic}, {&e.Source, webhookwire.HeaderEventSource}} {
		if *f.dst, err = webhookwire.Decode(h.Get(f.name)); err != nil {
			return e, fmt.Errorf("webhookconsumer: %s: %w", f.name, err)
		}
	}
	if e.Type == "" {
		return e, fmt.Errorf("webhookconsumer: %s is missing", webhookwire.HeaderEventType)
	}
	if want := webhookwire.MessageID(e.Source, e.ID); e.WebhookID != want {
		return e, fmt.Errorf("webhookconsumer: webhook-id %q does not name event %d", e.WebhookID, e.ID)
	}
	if e.Headers, err = webhookwire.EventHeaders(h); err != nil {
		return e, fmt.Errorf("webhookconsumer: %w", err)
	}
	return e, nil
}
