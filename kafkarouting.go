package outbox

import (
	"fmt"
	"strings"

	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/kafkatopic"
)

// DefaultMaxRecordBytes is Kafka's default message.max.bytes: the largest
// record batch a broker accepts, which is what one event becomes on the
// wire (see KafkaRouting.Size).
const DefaultMaxRecordBytes = 1048588

// KafkaRouting is the Routing of the Kafka sink (relay/kafkapub), and
// Emit's default: Config.TopicPrefix and Config.MaxRecordBytes build it
// when Config.Routing is nil.
//
// An event type routes to the topic TopicPrefix followed by the part of
// the type before its first '.': "order.placed" goes to "order" (or
// "prod.order" with prefix "prod."), and the result must be a valid Kafka
// topic name (1 to 249 characters of [a-zA-Z0-9._-], not "." or "..").
// An event's size is its Kafka record batch when it travels alone,
// uncompressed: what a topic's max.message.bytes is compared with.
type KafkaRouting struct {
	// TopicPrefix is prepended to the topic derived from an event's type.
	// It must match the relayer's. Defaults to "".
	TopicPrefix string
	// MaxRecordBytes is the largest record batch an event may make; set
	// it to the topics' max.message.bytes. Defaults to
	// DefaultMaxRecordBytes (1048588, Kafka's default message.max.bytes).
	MaxRecordBytes int
	// CloudEvents counts the CloudEvents headers (ce_id, ce_source, ...)
	// at their largest into each event's size: set it when the relayer
	// stamps them (kafkapub.PublisherConfig.CloudEvents, outbox relay
	// --cloudevents). Defaults to false.
	CloudEvents bool
}

var _ Routing = KafkaRouting{}

// Validate checks that TopicPrefix can start a topic name and that
// MaxRecordBytes (0 for the default) fits the smallest event.
func (k KafkaRouting) Validate() error {
	if least := k.Size("x", 1, nil); k.MaxRecordBytes != 0 && k.MaxRecordBytes < least {
		return fmt.Errorf("MaxRecordBytes is %d; the smallest event makes a record of %d bytes (key, the relayer's headers and Kafka's framing), so use at least that, or 0 for the default", k.MaxRecordBytes, least)
	}
	if k.TopicPrefix != "" {
		if err := kafkatopic.Validate(k.TopicPrefix + "x"); err != nil {
			return fmt.Errorf("TopicPrefix %q cannot start a topic name: %s", k.TopicPrefix, err)
		}
	}
	return nil
}

// Destination returns the Kafka topic events of eventType go to.
func (k KafkaRouting) Destination(eventType string) (string, error) {
	if eventType == "" {
		return "", fmt.Errorf("%w: the type is empty, so it names no topic; write it as \"topic.event\", e.g. \"order.placed\"", ErrInvalidTopic)
	}
	base, _, _ := strings.Cut(eventType, ".")
	if base == "" {
		return "", fmt.Errorf("%w: type %s starts with '.', so it names no topic; write it as \"topic.event\", e.g. \"order.placed\"", ErrInvalidTopic, quoteShort(eventType))
	}
	topic := k.TopicPrefix + base
	if err := kafkatopic.Validate(topic); err != nil {
		return "", fmt.Errorf("%w: type %s routes to %s", ErrInvalidTopic, quoteShort(eventType), err)
	}
	return topic, nil
}

// Size is RecordSize for an event not yet written: the longest event_id
// and an event_source of MaxSourceLen, so the figure holds whatever id the
// event gets and whatever source a relayer stamps.
func (k KafkaRouting) Size(eventType string, payloadLen int, headers map[string]string) int {
	if k.CloudEvents {
		headers = cloudevents.Kafka.WithMaxHeaders(eventType, headers)
	}
	return recordSize(maxEventIDLen, len(eventType), payloadLen, headers, MaxSourceLen)
}

// RecordSize is the most bytes the Kafka record batch of one event takes
// when it travels alone, uncompressed. eventType goes into the event_type
// header, payloadLen is the published value's length (Postgres' JSONB
// text of the payload), headers are the event's own (and the CloudEvents
// headers, when the relayer stamps them: k.CloudEvents is not consulted
// here), and source is the relayer's event_source ("" for none). eventID
// 0 counts the longest id.
func (k KafkaRouting) RecordSize(eventID int64, eventType string, payloadLen int, headers map[string]string, source string) int {
	idLen := maxEventIDLen
	if eventID > 0 {
		idLen = decimalLen(eventID)
	}
	return recordSize(idLen, len(eventType), payloadLen, headers, len(source))
}

// Limit is MaxRecordBytes (DefaultMaxRecordBytes when 0), in Kafka's
// words.
func (k KafkaRouting) Limit() SizeLimit {
	n := k.MaxRecordBytes
	if n == 0 {
		n = DefaultMaxRecordBytes
	}
	return SizeLimit{Bytes: n, Unit: "a record", Seen: "as the broker will see it", Raise: "MaxRecordBytes and the topic's max.message.bytes"}
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
