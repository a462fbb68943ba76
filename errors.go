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
	// ErrInvalidType: the event's type is not valid UTF-8 or holds a NUL
	// character, which a Postgres text column cannot store.
	ErrInvalidType = errors.New("outbox: event type cannot be stored")
	// ErrInvalidPayload: the payload is nil, not valid JSON, cannot be
	// marshalled to JSON, or holds what Postgres JSONB refuses: invalid
	// UTF-8, a \u0000 escape, a UTF-16 surrogate escape without its pair,
	// or a number beyond Postgres numeric's range.
	ErrInvalidPayload = errors.New("outbox: invalid payload")
	// ErrPayloadTooLarge: the event, as the sink will see it (Routing.Size
	// of the payload after Postgres' JSONB normalisation, with the event's
	// headers and what the relayer adds), is over the Routing's limit: with
	// KafkaRouting, its Kafka record is over MaxRecordBytes.
	ErrPayloadTooLarge = errors.New("outbox: event too large")
	// ErrInvalidTopic: the event's type routes to no destination of the
	// sink (Routing.Destination): with KafkaRouting, to no valid Kafka
	// topic name.
	ErrInvalidTopic = errors.New("outbox: event type maps to no valid topic")
	// ErrInvalidHeaders: a header name is empty or reserved by the relayer
	// (IsReservedHeader), or a name or value is not valid UTF-8 or holds a
	// NUL character.
	ErrInvalidHeaders = errors.New("outbox: invalid headers")
	// ErrContractViolation: the payload breaks its type's contract
	// (Config.Contracts), the type has none where every type must, or the
	// event names a version its contract does not have. The contract's own
	// error is wrapped too: errors.As a *contracts.Violation for the JSON
	// pointer and the rule.
	ErrContractViolation = errors.New("outbox: payload breaks its contract")
	// ErrEmptyBatch: EmitBatch was called with no events.
	ErrEmptyBatch = errors.New("outbox: empty batch")
)
