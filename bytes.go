package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Bytes is a payload of exact bytes in a format of its own: Protobuf, Avro,
// or JSON that must reach consumers as written. Emit stores Data byte for
// byte (bytea, in the table's payload_bytes column) and the relayer
// publishes it unchanged, with the content-type header (or the sink's
// content type property) set to ContentType instead of application/json.
//
//	outbox.Event{AggregateID: id, Type: "order.placed",
//	    Payload: outbox.Bytes{ContentType: "application/x-protobuf", Data: b}}
//
// Only an outbox table with binary payloads on takes it (`outbox migrate
// up --binary-payloads`, migrate.Migrator.EnableBinaryPayloads), through a
// Producer whose Config.BinaryPayloads says so: otherwise Emit refuses it
// with ErrBinaryPayloadsOff. A *Bytes is taken as its value.
type Bytes struct {
	// ContentType is the payload's media type, e.g.
	// "application/x-protobuf", "application/avro" or "application/json":
	// 1 to 255 printable ASCII characters with a '/' after the first
	// (parameters such as "; charset=utf-8" may follow). Required.
	ContentType string
	// Data is the payload. Any bytes, none included (a Protobuf message
	// whose fields are all defaults is empty). With a JSON content type
	// (application/json or a +json suffix) it must be valid JSON, and
	// Config.Contracts checks it; it is kept as written, whitespace, key
	// order, repeated keys and number text included.
	Data []byte
}

// ErrBinaryPayloadsOff: an event's payload is Bytes, and the Producer's
// Config.BinaryPayloads is off (its table takes JSON payloads only), or a
// Bytes payload of a type that has a contract is not JSON.
var ErrBinaryPayloadsOff = errors.New("outbox: binary payloads are off for this table")

// MaxContentTypeLen is the longest content type a Bytes payload may have:
// RabbitMQ's content_type property is a short string of at most 255 bytes.
const MaxContentTypeLen = 255

// IsJSONContentType reports whether a content type names JSON:
// application/json or a type with a +json suffix, parameters aside, in
// any case. The relayer's default content type, ContentTypeJSON, is one.
func IsJSONContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == ContentTypeJSON || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// CheckContentType returns why ct cannot be a Bytes payload's content
// type, or "": it must be 1-255 printable ASCII characters, start with a
// non-space, hold a '/' after its first character and not end with a
// space, what the table's CHECK and every sink's header take.
func CheckContentType(ct string) string {
	switch {
	case ct == "":
		return "is empty; name the payload's format, e.g. \"application/x-protobuf\""
	case len(ct) > MaxContentTypeLen:
		return fmt.Sprintf("is %d bytes long; the most a sink's content type takes is %d", len(ct), MaxContentTypeLen)
	}
	slash := strings.IndexByte(ct, '/')
	for i := 0; i < len(ct); i++ {
		c := ct[i]
		if c < ' ' || c > '~' || (c == ' ' && (i < slash || i == len(ct)-1)) {
			return fmt.Sprintf("holds %q at byte %d; use printable ASCII, with spaces only inside parameters", c, i)
		}
	}
	if slash < 1 {
		return "is not a media type (type/subtype), e.g. \"application/x-protobuf\""
	}
	return ""
}

// binaryPayload returns the Bytes of a payload that is one.
func binaryPayload(v any) (Bytes, bool) {
	switch b := v.(type) {
	case Bytes:
		return b, true
	case *Bytes:
		if b != nil {
			return *b, true
		}
	}
	return Bytes{}, false
}

// validateBinary is validate's part for a Bytes payload: the setting, the
// content type, the contract and the size of the raw bytes.
func (p *Producer) validateBinary(ev Event, b Bytes, versions string) (row, error) {
	if !p.cfg.BinaryPayloads {
		return row{}, fmt.Errorf("%w: event type %s has a Bytes payload (%s), and %s takes JSON payloads only: migrate it with `outbox migrate up --binary-payloads`, then set Config.BinaryPayloads",
			ErrBinaryPayloadsOff, quoteShort(ev.Type), quoteShort(b.ContentType), p.cfg.Tables.OutboxIdent())
	}
	if why := CheckContentType(b.ContentType); why != "" {
		return row{}, fmt.Errorf("%w (type %s): the content type %s %s", ErrInvalidPayload, quoteShort(ev.Type), quoteShort(b.ContentType), why)
	}
	isJSON := IsJSONContentType(b.ContentType)
	if isJSON && !json.Valid(b.Data) {
		return row{}, fmt.Errorf("%w (type %s): the content type %s says JSON, but the %d bytes are not valid JSON; fix them, or name their real format", ErrInvalidPayload, quoteShort(ev.Type), quoteShort(b.ContentType), len(b.Data))
	}
	if b.Data == nil {
		b.Data = []byte{} // an empty payload, not SQL NULL
	}
	var err error
	if isJSON {
		ev.Headers, err = p.checkContract(ev, b.Data, versions)
	} else {
		ev.Headers, err = p.checkBinaryContract(ev, b, versions)
	}
	if err != nil {
		return row{}, err
	}
	n := len(b.Data) + ContentTypeSizeExtra(b.ContentType)
	if err := p.checkSizeOf(ev, nil, n, false, "the payload's bytes with its content type"); err != nil {
		return row{}, err
	}
	r := row{payload: b.Data, contentType: b.ContentType}
	if len(ev.Headers) > 0 {
		hdr, err := json.Marshal(ev.Headers)
		if err != nil {
			return row{}, fmt.Errorf("%w (type %s): %s", ErrInvalidHeaders, quoteShort(ev.Type), err)
		}
		r.headers = string(hdr)
	}
	return r, nil
}

// checkBinaryContract refuses a payload that is not JSON for a type whose
// contract (a JSON Schema) it could never follow, and one the contracts
// require a contract for. A type without a contract passes, with the
// event_version header of Event.Version when set.
func (p *Producer) checkBinaryContract(ev Event, b Bytes, versions string) (map[string]string, error) {
	if p.cfg.Contracts != nil {
		v, err := p.cfg.Contracts.Check(ev.Type, ev.Version, b.Data)
		if err != nil || v != 0 {
			if err == nil {
				err = fmt.Errorf("version %d", v)
			}
			return nil, fmt.Errorf("%w (type %s): its payload is %s, and the type's contract is a JSON Schema, which only a JSON payload can follow; emit it as JSON, or as Bytes with content type application/json: %w",
				ErrContractViolation, quoteShort(ev.Type), quoteShort(b.ContentType), err)
		}
	}
	return versionHeaders(ev, nil, nil, versions)
}

// binaryArgs adds a row's bytes and content type to the single-event
// statement's arguments (the binary statements, sql.go): NULL and "" for
// a JSON event, "" in place of its JSON text for a binary one.
func (r row) binaryArgs(args []any) []any {
	if r.contentType == "" {
		return append(args, nil, "")
	}
	args[2] = ""
	return append(args, r.payload, r.contentType)
}

// ContentTypeSizeExtra is what a binary payload's content type adds to
// the size of its event on a sink, whose Routing.Size counts
// application/json: the difference in the content-type header or
// property, again in a CloudEvents datacontenttype header where the sink
// carries one as a header of its own (NATS, percent-encoded: a space, '"'
// or '%' takes three bytes), and one byte for a varint length the move
// could lengthen (Kafka). Emit and the relayer's size checks add it to the
// payload's length, so the count never falls short of the message.
func ContentTypeSizeExtra(ct string) int {
	encoded := len(ct)
	for i := 0; i < len(ct); i++ {
		if c := ct[i]; c == ' ' || c == '"' || c == '%' {
			encoded += 2
		}
	}
	return max(len(ct)-len(ContentTypeJSON), 0) + max(encoded-len(ContentTypeJSON), 0) + 1
}
