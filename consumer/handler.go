package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// Event is one delivered event, whatever the transport.
type Event struct {
	// ID is the event's id in its outbox table (the event_id header).
	// Always positive.
	ID int64
	// Source names the outbox the event came from (the event_source
	// header); "" when the producer set none. (Source, ID) is unique.
	Source string
	// Type is the event type, e.g. "order.placed" (the event_type header).
	Type string
	// AggregateID is the record key parsed as a UUID; uuid.Nil when the key
	// is not one.
	AggregateID uuid.UUID
	// Payload is the body, as the producer wrote it: JSON, or the exact
	// bytes of a binary payload (outbox.Bytes) in the format ContentType
	// names.
	Payload []byte
	// Version is the version of the type's contract the payload follows:
	// the event_version header (outbox.HeaderEventVersion), or 0 when the
	// header is absent or not a positive decimal. Upcasters.Want sets it,
	// with Payload, to the version the handler reads.
	Version int
	// OriginalPayload is the payload as delivered when an upcaster
	// (Upcasters.Want) has replaced Payload; nil otherwise. The
	// event_version header still holds the version it was delivered in.
	OriginalPayload []byte
	// ContentType is the payload's content type (the content-type header,
	// or the transport's content type property): application/json
	// unless the producer emitted a binary payload of another type.
	ContentType string
	// Headers holds every header of the record, including event_id,
	// event_type and event_source. A repeated header keeps its last value,
	// except those the relayer sets (outbox.IsReservedHeader), which keep
	// their first: the relayer's, as ID, Type and Source do.
	Headers map[string]string

	// Topic, Partition and Offset locate the record when the event came
	// from Kafka; zero otherwise.
	Topic     string
	Partition int32
	Offset    int64
}

// Handler applies one event's side effects inside tx, the transaction that
// also records the event as processed: the effects and the dedupe row
// commit or roll back together. A Handler must do its database work through
// tx, not through another connection, or that work escapes the guarantee.
// Returning an error rolls tx back; the event may then be retried.
type Handler func(ctx context.Context, tx pgx.Tx, ev Event) error

// Middleware wraps a Handler: retry policies, timeouts, logging, tracing.
type Middleware func(Handler) Handler

// Chain wraps h in mw, the first middleware outermost.
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

// PanicError is the error Recover turns a handler panic into.
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// Recover turns a panic in the handler into a *PanicError, so one bad
// event cannot crash the consumer. The Kafka Consumer applies it to every
// handler.
func Recover() Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, tx pgx.Tx, ev Event) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = &PanicError{Value: r, Stack: debug.Stack()}
				}
			}()
			return next(ctx, tx, ev)
		}
	}
}

// PermanentError marks a handler error that retrying cannot fix, such as
// a payload that does not decode. The Kafka Consumer dead-letters the
// event at once instead of retrying it.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a *PermanentError.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err is (or wraps) a *PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// Typed adapts a handler that takes the decoded payload. The payload is
// decoded with encoding/json into a new T; a payload that does not decode
// fails permanently (it will not decode on a retry either), and so does a
// payload whose content type is not JSON (a binary payload, e.g.
// Protobuf: read ev.Payload in a plain Handler). Unknown fields are
// ignored, so producers can add fields before consumers know them.
func Typed[T any](fn func(ctx context.Context, tx pgx.Tx, ev Event, payload T) error) Handler {
	return func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if ev.ContentType != "" && !outbox.IsJSONContentType(ev.ContentType) {
			return Permanent(fmt.Errorf("%q payload is %q, not JSON, so Typed cannot decode it into %T; handle the type with a Handler that decodes ev.Payload in its format", ev.Type, ev.ContentType, *new(T)))
		}
		var v T
		if err := json.Unmarshal(ev.Payload, &v); err != nil {
			return Permanent(fmt.Errorf("decode %q payload into %T: %w", ev.Type, v, err))
		}
		return fn(ctx, tx, ev, v)
	}
}
