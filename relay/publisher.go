package relay

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
)

// Message is one outbox row on its way to the broker.
type Message struct {
	// ID is the row's id: the event_id header.
	ID          int64
	AggregateID uuid.UUID
	Type        string
	// Topic is the sink's destination for the message, derived from Type
	// by the relayer with the sink's Routing.
	Topic string
	// Payload is the row's payload, published unchanged: its JSON text,
	// or its exact bytes on an outbox with binary payloads on.
	Payload []byte
	// ContentType is the payload's content type when the row holds a
	// binary payload (outbox.Bytes), "" for JSON. Sinks send
	// ContentTypeOf(m) in their content-type header or property.
	ContentType string
	// Headers are the row's own headers.
	Headers map[string]string
	// CreatedAt is when the row became pending: its created_at, or when
	// an operator last requeued it (replay, unpark).
	CreatedAt time.Time
}

// CloudEvent is what m's CloudEvents attributes are made of (package
// cloudevents), for sinks that stamp them: the id, the type, the
// aggregate as subject, CreatedAt as time and the event_version header.
func (m *Message) CloudEvent() cloudevents.Event {
	return cloudevents.Event{
		ID: m.ID, Type: m.Type, Subject: m.AggregateID.String(), Time: m.CreatedAt,
		Version: m.Headers[outbox.HeaderEventVersion], DataContentType: m.ContentType,
	}
}

// ContentTypeOf is the content type a sink sends with m: its
// ContentType, or outbox.ContentTypeJSON for a JSON payload.
func ContentTypeOf(m *Message) string {
	if m.ContentType != "" {
		return m.ContentType
	}
	return outbox.ContentTypeJSON
}

// SizedPayloadLen is the payload length to give a Routing's Size (or
// KafkaRouting.RecordSize) for m, whose sizes count the content type as
// application/json: the payload, plus outbox.ContentTypeSizeExtra of a
// binary payload's content type. It is the measure Emit used, so the
// relayer's check agrees with Emit's.
func SizedPayloadLen(m *Message) int {
	if m.ContentType == "" {
		return len(m.Payload)
	}
	return len(m.Payload) + outbox.ContentTypeSizeExtra(m.ContentType)
}

// Sink delivers batches to a broker (or any destination: a queue, a
// stream, a webhook), and owns what is the broker's: where an event type
// goes, what a destination may be called, and what its errors mean.
//
// Publish returns one error per message, in order: nil when the broker
// acknowledged the message, an error wrapped with Permanent (or
// PermanentReason) when the broker will never accept that message (too
// large, invalid destination, not authorised), any other error when a
// retry may succeed. The broker must keep the order of messages with the
// same AggregateID, and a message after a failed one of its aggregate must
// not be acknowledged ahead of it: Publish either leaves it unsent (any
// error) or sends it after the failed one. A permanent error must belong
// to the message that caused it, never to messages that merely shared a
// request with it.
//
// Routing returns the sink's routing for a source's TopicPrefix, or an
// error saying why the prefix cannot start a destination name; the
// sources call it once, in New, and fill each Message.Topic from its
// Destination. Producers must route alike (outbox.Config.Routing).
//
// ErrorCode names an error Publish returned, for the code label of
// metrics (monitor.Metrics): short, stable, from a small set (a label's values
// must be bounded), e.g. the broker's error name or "timeout".
//
// A sink may also implement MessagingSystem (for spans) and Readier (for
// a readiness check).
type Sink interface {
	Publish(ctx context.Context, msgs []Message) []error
	Routing(topicPrefix string) (outbox.Routing, error)
	ErrorCode(err error) string
}

// Readier is implemented by a Sink that can tell whether it can deliver
// now, beyond its broker answering: `outbox relay`'s /readyz asks it.
type Readier interface {
	Ready(ctx context.Context) error
}

// Reasons a row is held: short, stable codes for metrics, alerts and the
// failures table, next to the full error message.
const (
	// ReasonTooLarge: the record is larger than the topic accepts.
	ReasonTooLarge = "too_large"
	// ReasonInvalidTopic: the type routes to no valid or existing topic
	// (the sink's destination).
	ReasonInvalidTopic = "invalid_topic"
	// ReasonUndecodable: the row's headers are not a JSON object of
	// strings (written by hand, not by Emit).
	ReasonUndecodable = "undecodable"
	// ReasonReservedHeader: the row's headers use a name the relayer sets
	// (event_id, event_type, content-type, event_source).
	ReasonReservedHeader = "reserved_header"
	// ReasonContract: the payload breaks its type's contract
	// (Common.Contracts), names a version the contract does not have (its
	// event_version header), or the type has none where every type must.
	// The relayer refuses the row before sending it; fix the row or the
	// contract, then retry it.
	ReasonContract = "contract"
	// ReasonNotAuthorized: the broker refuses the relayer's writes to the
	// topic.
	ReasonNotAuthorized = "not_authorized"
	// ReasonBrokerRefused: any other permanent refusal.
	ReasonBrokerRefused = "broker_refused"
)

// PermanentError marks a per-message failure that retrying will not fix.
type PermanentError struct {
	// Reason is one of the Reason constants; ReasonBrokerRefused when empty.
	Reason string
	Err    error
}

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError with ReasonBrokerRefused. It
// returns nil for a nil err.
func Permanent(err error) error { return PermanentReason(ReasonBrokerRefused, err) }

// PermanentReason wraps err as a PermanentError with reason. It returns nil
// for a nil err.
func PermanentReason(reason string, err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Reason: reason, Err: err}
}

// IsPermanent reports whether err is (or wraps) a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// ReasonOf returns the reason of a permanent error, or "" for any other.
func ReasonOf(err error) string {
	var p *PermanentError
	if !errors.As(err, &p) {
		return ""
	}
	if p.Reason == "" {
		return ReasonBrokerRefused
	}
	return p.Reason
}
