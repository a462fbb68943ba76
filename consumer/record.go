package consumer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/internal/pgtext"
)

// Headers the Consumer adds to a dead-lettered record, after the original
// record's own headers (which it keeps, with its key and value, unless the
// broker refuses such a copy: see HeaderDLQValueDropped).
const (
	// HeaderDLQError is why the record was dead-lettered: the handler's
	// last error, or what is malformed about the record.
	HeaderDLQError = "dlq_error"
	// HeaderDLQConsumer is the Name of the consumer that gave up on it.
	HeaderDLQConsumer = "dlq_consumer"
	// HeaderDLQAttempts is how many times the handler ran, in decimal; 0
	// for a malformed record, which never reaches a handler.
	HeaderDLQAttempts = "dlq_attempts"
	// HeaderDLQOriginalTopic, HeaderDLQOriginalPartition and
	// HeaderDLQOriginalOffset locate the original record.
	HeaderDLQOriginalTopic     = "dlq_original_topic"
	HeaderDLQOriginalPartition = "dlq_original_partition"
	HeaderDLQOriginalOffset    = "dlq_original_offset"
	// HeaderDLQValueDropped, present only on a pointer record, is the
	// original value's length in bytes, in decimal. The broker refused
	// the whole dead-letter copy (too large once the dlq_* headers were
	// added, or invalid), so the Consumer wrote this pointer record
	// instead: the original key, an empty value, the dlq_* headers and,
	// unless HeaderDLQHeadersDropped is present, the original headers.
	// Read the original value from the original topic at
	// dlq_original_partition and dlq_original_offset, while retention
	// keeps it.
	HeaderDLQValueDropped = "dlq_value_dropped"
	// HeaderDLQHeadersDropped, present only on a pointer record, is how
	// many headers the original record had, in decimal: the pointer
	// record with them was refused too, so it carries only the dlq_*
	// headers.
	HeaderDLQHeadersDropped = "dlq_headers_dropped"
)

// maxDLQErrorBytes bounds the dlq_error header: a handler error can carry
// a whole response body, and the dead-letter record must still fit the
// broker's message size limit.
const maxDLQErrorBytes = 4 << 10

// MalformedError says why a message cannot be processed at all: it is
// dead-lettered at once, never retried.
type MalformedError struct {
	// Reason says what is wrong with the message, and what would be right.
	Reason string
}

func (m *MalformedError) Error() string { return "malformed record: " + m.Reason }

// decode turns a record into an Event, or says why it is malformed.
// Routing (an unknown type) is checked by the caller.
//
// A reserved header (outbox.IsReservedHeader) that occurs more than once
// keeps its first value: the relayer writes its own headers before the
// event's, so a second event_id or event_source can only come from another
// producer (kcat, a hand-built record), and must not change the dedupe key.
// Other repeated headers keep their last value.
func decode(r *kgo.Record) (Event, *MalformedError) {
	ev := Event{
		Headers:   make(map[string]string, len(r.Headers)),
		Payload:   r.Value,
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
	}
	for _, h := range r.Headers {
		if _, seen := ev.Headers[h.Key]; seen && outbox.IsReservedHeader(h.Key) {
			continue
		}
		ev.Headers[h.Key] = string(h.Value)
	}
	return decodeEvent(ev, string(r.Key))
}

// decodeEvent completes ev from its Headers, its Payload and the
// aggregate's key as carried, or says why it is malformed: the checks
// every transport shares.
func decodeEvent(ev Event, key string) (Event, *MalformedError) {
	rawID, ok := ev.Headers[outbox.HeaderEventID]
	if !ok {
		return ev, &MalformedError{"no " + outbox.HeaderEventID + " header; records must come from the outbox relayer, or carry the outbox row id in it"}
	}
	id, err := parseEventID(rawID)
	if err != nil {
		return ev, &MalformedError{err.Error()}
	}
	ev.ID = id
	ev.Type = ev.Headers[outbox.HeaderEventType]
	ev.Source = ev.Headers[outbox.HeaderEventSource]
	// The source goes into the processed table's text column (which
	// refuses it otherwise, on every retry), and handlers store the type.
	for _, h := range [...]struct{ name, value string }{
		{outbox.HeaderEventSource, ev.Source},
		{outbox.HeaderEventType, ev.Type},
	} {
		if why := pgtext.Invalid(h.value); why != "" {
			return ev, &MalformedError{fmt.Sprintf("%s header %q %s; it must be text Postgres can store", h.name, clip.Text(h.value, 64), why)}
		}
	}
	// A version that does not parse is left 0 here: only a handler that
	// reads versions (Upcasters.Want) refuses it, so consumers that never
	// look at versions keep working when a producer writes a bad header.
	if v, err := parseVersion(ev.Headers[outbox.HeaderEventVersion]); err == nil {
		ev.Version = v
	}
	if agg, err := uuid.Parse(key); err == nil {
		ev.AggregateID = agg
	}
	ev.ContentType = ev.Headers[outbox.HeaderContentType]
	if ev.ContentType == "" {
		ev.ContentType = outbox.ContentTypeJSON
	}
	if !outbox.IsJSONContentType(ev.ContentType) {
		return ev, nil // a binary payload: its bytes are the handler's to read
	}
	if !json.Valid(ev.Payload) {
		return ev, &MalformedError{fmt.Sprintf("payload of %d bytes is not valid JSON", len(ev.Payload))}
	}
	// encoding/json accepts invalid UTF-8 inside strings; JSON text must
	// be UTF-8 and a JSONB column refuses it.
	if !utf8.Valid(ev.Payload) {
		return ev, &MalformedError{fmt.Sprintf("payload of %d bytes is JSON but not valid UTF-8", len(ev.Payload))}
	}
	return ev, nil
}

// parseEventID accepts what the relayer writes: a positive decimal int64,
// digits only (no sign, no spaces).
func parseEventID(s string) (int64, error) {
	bad := func() (int64, error) {
		return 0, fmt.Errorf("%s header %q is not a positive decimal integer", outbox.HeaderEventID, clip.Text(s, 64))
	}
	if s == "" || len(s) > 19 {
		return bad()
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return bad()
		}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return bad()
	}
	return id, nil
}
