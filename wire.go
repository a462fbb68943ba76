package outbox

import "unicode/utf8"

// The wire contract: what every published record carries besides the
// event's own headers. The relayer writes these headers, Emit refuses them
// as user headers, and consumers read them.
const (
	// HeaderEventID is the outbox row id in decimal: the event's identity,
	// which consumers deduplicate on.
	HeaderEventID = "event_id"
	// HeaderEventType is the event's Type.
	HeaderEventType = "event_type"
	// HeaderContentType is always "application/json".
	HeaderContentType = "content-type"
	// HeaderEventSource names the outbox a record came from, when the
	// relayer is given a source. event_id is unique only within one outbox;
	// consumers make (source, event_id) their dedupe key.
	HeaderEventSource = "event_source"
)

// ContentTypeJSON is the value of the content-type header.
const ContentTypeJSON = "application/json"

// MaxSourceLen is the longest event_source a relayer accepts. Emit counts
// an event_source header of this length into an event's record size, so an
// event it accepts fits whatever source the relayer stamps.
const MaxSourceLen = 200

// IsReservedHeader reports whether name is a header the relayer sets, which
// an event's own headers must not use.
func IsReservedHeader(name string) bool {
	switch name {
	case HeaderEventID, HeaderEventType, HeaderContentType, HeaderEventSource:
		return true
	}
	return false
}

// aggregateKeyLen is the record key: the aggregate id in its canonical
// 36-character text form.
const aggregateKeyLen = 36

// maxEventIDLen is the longest decimal int64.
const maxEventIDLen = 19

// recordBatchOverhead is the Kafka v2 record batch header that wraps a
// record on the wire (61 bytes), plus the record's fixed fields at their
// largest: attributes (1 byte), timestamp delta (a varlong, up to 10) and
// offset delta (a varint, up to 5). A broker's max.message.bytes limits the
// whole batch, so a record that travels alone must fit with all of it.
const recordBatchOverhead = 61 + 1 + 10 + 5

// RecordSize is the most bytes the Kafka record batch of one event takes
// when it travels alone, uncompressed: what a topic's max.message.bytes is
// compared with. eventType goes into the event_type header, payload is the
// published value (Postgres' JSONB text of the payload), headers are the
// event's own, and source is the relayer's event_source ("" for none).
// eventID 0 counts the longest id.
func RecordSize(eventID int64, eventType string, payloadLen int, headers map[string]string, source string) int {
	idLen := maxEventIDLen
	if eventID > 0 {
		idLen = decimalLen(eventID)
	}
	return recordSize(idLen, len(eventType), payloadLen, headers, len(source))
}

// MaxRecordSize is RecordSize for an event not yet written: the longest
// event_id and an event_source of MaxSourceLen, so the figure holds
// whatever id the event gets and whatever source a relayer stamps.
func MaxRecordSize(eventType string, payloadLen int, headers map[string]string) int {
	return recordSize(maxEventIDLen, len(eventType), payloadLen, headers, MaxSourceLen)
}

func recordSize(idLen, typeLen, payloadLen int, headers map[string]string, sourceLen int) int {
	body := recordBatchOverhead - 61
	body += varintLen(aggregateKeyLen) + aggregateKeyLen
	body += varintLen(payloadLen) + payloadLen
	n := 3 + len(headers)
	body += headerLen(HeaderEventID, idLen) + headerLen(HeaderEventType, typeLen) +
		headerLen(HeaderContentType, len(ContentTypeJSON))
	if sourceLen > 0 {
		n++
		body += headerLen(HeaderEventSource, sourceLen)
	}
	for k, v := range headers {
		body += headerLen(k, len(v))
	}
	body += varintLen(n)
	return 61 + varintLen(body) + body
}

func headerLen(key string, valueLen int) int {
	return varintLen(len(key)) + len(key) + varintLen(valueLen) + valueLen
}

// varintLen is the length of n as a Kafka (zigzag) varint.
func varintLen(n int) int {
	u := uint64(n) << 1
	if n < 0 {
		u = ^u
	}
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

func decimalLen(n int64) int {
	l := 1
	for n >= 10 {
		n /= 10
		l++
	}
	return l
}

// ValidText reports why s cannot be stored in a Postgres text column of a
// UTF-8 database (or a JSONB string), or "" when it can: it must be valid
// UTF-8 without NUL characters.
func ValidText(s string) string {
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return "contains a NUL character"
		}
	}
	return ""
}
