package relay

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// Message is one outbox row on its way to the broker.
type Message struct {
	// ID is the row's id: the event_id header.
	ID          int64
	AggregateID uuid.UUID
	Type        string
	// Topic is derived from Type by the relayer.
	Topic string
	// Payload is the row's JSON payload, published unchanged.
	Payload []byte
	// Headers are the row's own headers.
	Headers   map[string]string
	CreatedAt time.Time
}

// Publisher delivers a batch to a broker. Publish returns one error per
// message, in order: nil when the broker acknowledged the message, an error
// wrapped with Permanent when the broker will never accept it (too large,
// invalid topic, not authorised), any other error when a retry may succeed.
// The broker must keep the order of messages with the same AggregateID.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) []error
}

// PermanentError marks a per-message failure that retrying will not fix.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError.
func Permanent(err error) error { return &PermanentError{Err: err} }

// IsPermanent reports whether err is (or wraps) a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}
