package routing

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
)

// DefaultNATSMaxPayloadBytes is nats-server's default max_payload (1 MiB):
// the largest message, headers included, a server accepts.
const DefaultNATSMaxPayloadBytes = 1 << 20

// HeaderNATSMsgID is the header JetStream deduplicates on within a
// stream's duplicate window. The NATS sink sets it to the event's
// source-qualified id (NATSMsgID).
const HeaderNATSMsgID = "Nats-Msg-Id"

// NATS is the Routing of the NATS JetStream sink (relay/natspub).
//
// An event type routes to the subject TopicPrefix followed by the type:
// "order.placed" goes to "order.placed" (or "shop.order.placed" with
// prefix "shop."), so a stream captures a type, or a family of them with
// a wildcard ("shop.order.>"). The subject must be valid for publishing:
// tokens separated by '.', none empty, no whitespace or control
// characters, and no '*' or '>' (wildcards only subscribers may use).
//
// An event's size is its NATS message: the payload and the header block
// (the relayer's headers, the event's own, Nats-Msg-Id), which the
// server's max_payload and the stream's max_msg_size limit.
type NATS struct {
	// TopicPrefix is prepended to each event type to make its subject.
	// It must match the relayer's. Defaults to "".
	TopicPrefix string
	// MaxPayloadBytes is the largest message an event may make, headers
	// included; set it to the smaller of the server's max_payload and the
	// streams' max_msg_size. Defaults to DefaultNATSMaxPayloadBytes (1
	// MiB, nats-server's default max_payload).
	MaxPayloadBytes int
	// CloudEvents counts the CloudEvents headers (ce-id, ce-source, ...)
	// at their largest into each event's size: set it when the relayer
	// stamps them (natspub.Config.CloudEvents, outbox relay
	// --cloudevents). Defaults to false.
	CloudEvents bool
}

var _ outbox.Routing = NATS{}

// Validate checks that TopicPrefix can start a subject and that
// MaxPayloadBytes (0 for the default) fits the smallest event.
func (n NATS) Validate() error {
	if least := n.Size("x", 2, nil); n.MaxPayloadBytes != 0 && n.MaxPayloadBytes < least {
		return fmt.Errorf("MaxPayloadBytes is %d; the smallest event makes a NATS message of %d bytes (the relayer's headers and Nats-Msg-Id), so use at least that, or 0 for the default", n.MaxPayloadBytes, least)
	}
	if n.TopicPrefix != "" {
		if why := subjectFault(n.TopicPrefix + "x"); why != "" {
			return fmt.Errorf("TopicPrefix %q cannot start a NATS subject: %s; use tokens of letters, digits, '-' or '_' ending in '.', e.g. \"shop.\"", n.TopicPrefix, why)
		}
	}
	return nil
}

// Destination returns the subject events of eventType are published to.
func (n NATS) Destination(eventType string) (string, error) {
	if eventType == "" {
		return "", fmt.Errorf("%w: the type is empty, so it names no NATS subject; write it as dot-separated tokens, e.g. \"order.placed\"", outbox.ErrInvalidTopic)
	}
	subject := n.TopicPrefix + eventType
	if why := subjectFault(subject); why != "" {
		return "", fmt.Errorf("%w: type %s makes NATS subject %s, which %s; write the type as dot-separated tokens of letters, digits, '-' or '_', e.g. \"order.placed\"",
			outbox.ErrInvalidTopic, short(eventType), short(subject), why)
	}
	return subject, nil
}

// subjectFault says why s cannot be published to, or "" when it can.
func subjectFault(s string) string {
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	for i, tok := range strings.Split(s, ".") {
		if tok == "" {
			switch {
			case i == 0:
				return "starts with '.' (an empty token)"
			case strings.HasSuffix(s, "."):
				return "ends with '.' (an empty token)"
			}
			return "has an empty token (\"..\")"
		}
		for _, r := range tok {
			switch {
			case r == '*' || r == '>':
				return fmt.Sprintf("holds %q, a wildcard only subscribers may use", r)
			case unicode.IsSpace(r):
				return "holds whitespace"
			case unicode.IsControl(r):
				return "holds a control character"
			}
		}
	}
	return ""
}

// Size is MessageSize for an event not yet written: the longest event_id
// and an event_source of outbox.MaxSourceLen, so the figure holds
// whatever id the event gets and whatever source a relayer stamps.
func (n NATS) Size(eventType string, payloadLen int, headers map[string]string) int {
	if n.CloudEvents {
		headers = cloudevents.NATS.WithMaxHeaders(eventType, headers)
	}
	return natsSize(maxEventIDLen, len(eventType), payloadLen, headers, outbox.MaxSourceLen)
}

// MessageSize is the bytes the NATS message of one event takes as the
// server measures it against max_payload and max_msg_size: the payload
// and the header block. eventType goes into the event_type header,
// payloadLen is the published payload's length, headers are the event's
// own (and the CloudEvents headers, when the relayer stamps them), source the relayer's event_source ("" for none). eventID 0 counts
// the longest id.
func (n NATS) MessageSize(eventID int64, eventType string, payloadLen int, headers map[string]string, source string) int {
	idLen := maxEventIDLen
	if eventID > 0 {
		idLen = len(strconv.FormatInt(eventID, 10))
	}
	return natsSize(idLen, len(eventType), payloadLen, headers, len(source))
}

// Limit is MaxPayloadBytes (DefaultNATSMaxPayloadBytes when 0), in NATS's
// words.
func (n NATS) Limit() outbox.SizeLimit {
	b := n.MaxPayloadBytes
	if b == 0 {
		b = DefaultNATSMaxPayloadBytes
	}
	return outbox.SizeLimit{Bytes: b, Unit: "a NATS message", Seen: "with its headers",
		Raise: "routing.NATS.MaxPayloadBytes, the server's max_payload and the stream's max_msg_size"}
}

// NATSMsgID is the Nats-Msg-Id of an event: "<source>:<id>", or the id
// alone when the relayer stamps no source, so that two outboxes' events
// with one id are not taken for duplicates of each other.
func NATSMsgID(source string, eventID int64) string {
	id := strconv.FormatInt(eventID, 10)
	if source == "" {
		return id
	}
	return source + ":" + id
}

// maxEventIDLen is the longest decimal int64.
const maxEventIDLen = 19

// aggregateIDLen is a UUID's canonical text form.
const aggregateIDLen = 36

// NATS header block framing: "NATS/1.0\r\n", then "key: value\r\n" per
// header, then "\r\n".
const (
	natsHeaderFraming = len("NATS/1.0\r\n") + len("\r\n")
	natsPerHeader     = len(": \r\n")
)

func natsSize(idLen, typeLen, payloadLen int, headers map[string]string, sourceLen int) int {
	size := payloadLen + natsHeaderFraming
	field := func(k string, vLen int) { size += len(k) + vLen + natsPerHeader }
	msgID := idLen
	if sourceLen > 0 {
		msgID += sourceLen + 1
		field(outbox.HeaderEventSource, sourceLen)
	}
	field(HeaderNATSMsgID, msgID)
	field(outbox.HeaderEventID, idLen)
	field(outbox.HeaderEventType, typeLen)
	field(outbox.HeaderContentType, len(outbox.ContentTypeJSON))
	field(outbox.HeaderAggregateID, aggregateIDLen)
	for k, v := range headers {
		ek, ev := EscapeNATSHeader(k, v)
		field(ek, len(ev))
	}
	return size
}

// short quotes s, cut to 64 bytes, for error messages.
func short(s string) string {
	const most = 64
	if len(s) <= most {
		return strconv.Quote(s)
	}
	cut := most
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("… (%d bytes)", len(s))
}
