package webhookconsumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/internal/webhookwire"
)

// Defaults of HandlerConfig.
const (
	DefaultMaxBodyBytes = 1 << 20
	DefaultWorkTimeout  = time.Minute
)

// HandlerConfig configures a Handler.
type HandlerConfig struct {
	// Dispatcher processes each event: dedupe in the processed table and
	// the handler's effects in one transaction, with retries. Its System
	// should be "webhook". Required.
	Dispatcher *consumer.Dispatcher
	// Verifier checks each request's signature. Required.
	Verifier *Verifier
	// MaxBodyBytes is the largest body read; a larger request is answered
	// 413, which the relay holds as too_large. Defaults to
	// DefaultMaxBodyBytes (1 MiB, the relay's default max_bytes).
	MaxBodyBytes int64
	// WorkTimeout bounds an event's transaction once the request is gone
	// (the relay gave up waiting): the transaction in flight may still
	// commit, and the relay's retry is then a duplicate. Defaults to
	// DefaultWorkTimeout (1m).
	WorkTimeout time.Duration
	// DeadLetter, when set, receives each event that can never be
	// processed (malformed, or its handler failed for good) and keeps it
	// somewhere of the application's; once it returns nil the request is
	// answered 204 and the aggregate's next events flow. An error answers
	// 503: the relay sends the event again. Defaults to nil: such an event
	// is answered 422 with the reason, and the relay holds its row (the
	// outbox's dead letter: 'outbox events retry' sends it again, 'outbox
	// events park' sets it aside).
	DeadLetter func(ctx context.Context, d consumer.Delivery, res consumer.Result) error
	// Logger receives refused requests. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg HandlerConfig) WithDefaults() HandlerConfig {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.WorkTimeout == 0 {
		cfg.WorkTimeout = DefaultWorkTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Validate reports the first field of cfg a Handler cannot use.
func (cfg HandlerConfig) Validate() error {
	switch {
	case cfg.Dispatcher == nil:
		return errors.New("webhookconsumer: Dispatcher is required (consumer.NewDispatcher)")
	case cfg.Verifier == nil:
		return errors.New("webhookconsumer: Verifier is required (NewVerifier with the relay's secret)")
	case cfg.MaxBodyBytes < 0:
		return fmt.Errorf("webhookconsumer: MaxBodyBytes is %d; use a positive size, or 0 for %d", cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	case cfg.WorkTimeout < 0:
		return fmt.Errorf("webhookconsumer: WorkTimeout is %s; use a positive duration, or 0 for %s", cfg.WorkTimeout, DefaultWorkTimeout)
	}
	return nil
}

// Handler is the http.Handler that receives the webhook sink's events:
// it verifies the signature, processes the event on the Dispatcher, and
// answers 2xx only once its effects are committed (or it was a
// duplicate). It answers 401 to a bad signature, 413 to a body over
// MaxBodyBytes, 422 to an event that can never be processed (see
// HandlerConfig.DeadLetter) and 503 when it stopped before the event was
// settled; the relay retries 503 and holds the row on the others.
type Handler struct{ cfg HandlerConfig }

// NewHandler checks cfg (after WithDefaults) and builds a Handler.
func NewHandler(cfg HandlerConfig) (*Handler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Handler{cfg: cfg}, nil
}

// ServeHTTP handles one delivery.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "webhook deliveries are POSTs", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("the body is over %d bytes", h.cfg.MaxBodyBytes), http.StatusRequestEntityTooLarge)
		}
		return
	}
	if err := h.cfg.Verifier.Verify(r.Header, body); err != nil {
		h.cfg.Logger.Warn("webhook request refused", "err", err, "webhook_id", r.Header.Get(webhookwire.HeaderID))
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	d, err := delivery(r.Header, body)
	if err != nil {
		h.deadLetter(w, r, d, consumer.Result{Verdict: consumer.DeadLetter, Reason: err.Error(), Malformed: true})
		return
	}
	work, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.WorkTimeout)
	defer cancel()
	res := h.cfg.Dispatcher.Dispatch(r.Context(), work, d)
	switch res.Verdict {
	case consumer.Done:
		w.WriteHeader(http.StatusNoContent)
	case consumer.DeadLetter:
		h.deadLetter(w, r, d, res)
	default:
		http.Error(w, "stopped before the event was processed; send it again", http.StatusServiceUnavailable)
	}
}

// deadLetter hands res to HandlerConfig.DeadLetter, or answers 422.
func (h *Handler) deadLetter(w http.ResponseWriter, r *http.Request, d consumer.Delivery, res consumer.Result) {
	if h.cfg.DeadLetter == nil {
		http.Error(w, "cannot be processed: "+res.Reason, http.StatusUnprocessableEntity)
		return
	}
	if err := h.cfg.DeadLetter(r.Context(), d, res); err != nil {
		h.cfg.Logger.Error("webhook dead letter not kept", "err", err, "webhook_id", r.Header.Get(webhookwire.HeaderID))
		http.Error(w, "dead letter not kept; send it again", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// delivery is a request as the Dispatcher reads it: the wire contract's
// headers under their own names, beside the event's own.
func delivery(h http.Header, body []byte) (consumer.Delivery, error) {
	d := consumer.Delivery{Payload: body, Key: h.Get(webhookwire.HeaderAggregateID)}
	ev, err := ReadEvent(h, body)
	d.Topic = ev.Topic
	if err != nil {
		return d, err
	}
	d.Headers = ev.Headers
	d.Headers[outbox.HeaderEventID] = strconv.FormatInt(ev.ID, 10)
	d.Headers[outbox.HeaderEventType] = ev.Type
	if ev.Source != "" {
		d.Headers[outbox.HeaderEventSource] = ev.Source
	}
	if ct := h.Get("Content-Type"); ct != "" {
		d.Headers[outbox.HeaderContentType] = ct
	}
	return d, nil
}
