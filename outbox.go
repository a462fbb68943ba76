package outbox

import (
	"fmt"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/internal/lockkey"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// Event is one event to emit. The relayer publishes it to the destination
// the sink's Routing gives its Type (with KafkaRouting, the default, the
// topic before the first '.'), keyed by AggregateID, with Payload as the
// value.
//
// Emit refuses an event that could never be published, before any SQL runs
// (so the caller's transaction stays usable) and with a typed error: what
// Postgres cannot store, and an event larger than its Routing's limit
// (ErrPayloadTooLarge; with KafkaRouting, a record larger than
// Config.MaxRecordBytes as the broker will see it). That size is
// Routing.Size of the payload as Postgres prints its JSONB, which can be
// longer than the bytes given ("[0,0]" is published as "[0, 0]", "1e3" as
// "1000"), plus the key, Type, Headers and the headers the relayer adds.
// Nothing is rewritten to make an event fit.
type Event struct {
	// AggregateID identifies the entity the event is about. Events of one
	// aggregate reach the broker in commit order and land in one partition.
	AggregateID uuid.UUID
	// Type names the event, e.g. "order.placed". The Routing must give it
	// a destination (ErrInvalidTopic; with KafkaRouting the part before the
	// first '.' is the topic), and it must be valid UTF-8 without NUL
	// characters (ErrInvalidType).
	Type string
	// Payload is the event body. []byte and json.RawMessage are taken as
	// JSON text and validated; any other value is marshalled with
	// encoding/json. Postgres stores it as JSONB, so the published bytes are
	// its canonical text: the same JSON value, with whitespace and key order
	// normalised, the last of repeated keys kept and numbers printed as
	// Postgres numeric. Emit refuses (ErrInvalidPayload) what JSONB cannot
	// store: invalid UTF-8, a \u0000 escape, a UTF-16 surrogate escape
	// without its pair, and a number with more than 131072 digits before
	// the decimal point or 16383 after once its exponent is applied.
	Payload any
	// Headers are extra Kafka headers (trace context, user metadata). Emit
	// adds the trace context of the span in its ctx (traceparent and
	// tracestate, see Config.Propagator) to a copy, keeping what the caller
	// set; Headers itself is not modified. The names the relayer sets
	// (event_id, event_type, content-type and event_source;
	// IsReservedHeader) are refused, as are names and values that are not
	// valid UTF-8 or hold a NUL character (ErrInvalidHeaders).
	Headers map[string]string
	// Version is the version of the type's contract that Payload follows,
	// sent as the event_version header. With Config.Contracts set, Emit
	// checks Payload against it, and 0 means the type's latest version;
	// without contracts, 0 sends no version. Defaults to 0.
	Version int
}

// Default names, used when a Tables field is empty.
const (
	DefaultSchema         = "public"
	DefaultOutboxTable    = "events_outbox"
	DefaultProcessedTable = "processed_events"
)

// Tables names the outbox's tables. Several outboxes can live in one database
// under different names or schemas. Names are validated and always quoted.
type Tables struct {
	// Schema holds both tables. Defaults to "public".
	Schema string
	// Outbox is the outbox table. Defaults to "events_outbox".
	Outbox string
	// Processed is the consumer dedupe table. Defaults to "processed_events".
	Processed string
}

// WithDefaults returns t with empty fields set to their defaults.
func (t Tables) WithDefaults() Tables {
	if t.Schema == "" {
		t.Schema = DefaultSchema
	}
	if t.Outbox == "" {
		t.Outbox = DefaultOutboxTable
	}
	if t.Processed == "" {
		t.Processed = DefaultProcessedTable
	}
	return t
}

// Validate checks every name (after defaults) is a plain identifier.
func (t Tables) Validate() error {
	t = t.WithDefaults()
	for _, n := range []struct{ what, name string }{
		{"schema", t.Schema}, {"outbox table", t.Outbox}, {"processed table", t.Processed},
	} {
		if err := pgident.Validate(n.what, n.name); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
	}
	// Migration bookkeeping and index names derive from the outbox name.
	if len(t.Outbox) > pgident.MaxLen-len("_aggregate_pending_idx") {
		return fmt.Errorf("outbox: outbox table name %q is too long; keep it under %d bytes so its index names fit", t.Outbox, pgident.MaxLen-len("_aggregate_pending_idx"))
	}
	return nil
}

// OutboxIdent is the quoted, schema-qualified outbox table.
func (t Tables) OutboxIdent() string {
	t = t.WithDefaults()
	return pgident.Qualified(t.Schema, t.Outbox)
}

// ProcessedIdent is the quoted, schema-qualified processed-events table.
func (t Tables) ProcessedIdent() string {
	t = t.WithDefaults()
	return pgident.Qualified(t.Schema, t.Processed)
}

// Channel is the LISTEN/NOTIFY channel Emit notifies and the relayer listens
// on. It is derived from the table so two outboxes do not wake each other.
func (t Tables) Channel() string {
	t = t.WithDefaults()
	return lockkey.Channel(t.Schema, t.Outbox)
}

// MessagePrefix is the prefix of the logical decoding messages that carry
// this outbox's events in ModeMessage: "outbox:<schema>.<table>". The WAL
// source reads the events of its outbox from the messages with it.
func (t Tables) MessagePrefix() string {
	t = t.WithDefaults()
	return "outbox:" + t.Schema + "." + t.Outbox
}

// LockNamespace is the first key of the two-key advisory locks Emit takes,
// fixed per outbox table so they cannot collide with an application's own
// single-key advisory locks nor with another outbox's. Every advisory-lock
// key is derived in internal/lockkey.
func (t Tables) LockNamespace() int32 {
	t = t.WithDefaults()
	return lockkey.Emit(t.Schema, t.Outbox)
}
