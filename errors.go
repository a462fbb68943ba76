package outbox

import "errors"

// Errors returned by Emit and EmitBatch before anything is written. They are
// wrapped with details (which event, what was wrong, what to do); test for
// them with errors.Is. A failed validation leaves the caller's transaction
// untouched and usable: no statement was sent.
var (
	// ErrEmptyType: the event has no Type.
	ErrEmptyType = errors.New("outbox: event type is empty")
	// ErrNilAggregate: the event's AggregateID is the nil UUID.
	ErrNilAggregate = errors.New("outbox: aggregate id is the nil UUID")
	// ErrInvalidPayload: the payload is nil, not valid JSON, or cannot be
	// marshalled to JSON.
	ErrInvalidPayload = errors.New("outbox: payload is not valid JSON")
	// ErrPayloadTooLarge: the serialised payload is over the producer's
	// MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("outbox: payload too large")
	// ErrInvalidTopic: the event's type routes to no valid Kafka topic name.
	ErrInvalidTopic = errors.New("outbox: event type maps to no valid topic")
	// ErrInvalidHeaders: a header name is empty or reserved by the relayer.
	ErrInvalidHeaders = errors.New("outbox: invalid headers")
	// ErrEmptyBatch: EmitBatch was called with no events.
	ErrEmptyBatch = errors.New("outbox: empty batch")
)
