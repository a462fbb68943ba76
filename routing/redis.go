package routing

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/pgoutbox/outbox"
)

// DefaultRedisMaxBytes is the largest stream entry routing.Redis accepts
// by default: 1 MiB, Kafka's default too, so that producers moving between
// the two sinks keep their limit. Redis itself takes entries up to its
// proto-max-bulk-len (512 MB) per field, but every entry lives in the
// server's memory until it is trimmed, and a consumer reading a page of
// entries (XREADGROUP COUNT n) holds n of them at once: entries of
// megabytes belong in object storage, with a reference in the event.
const DefaultRedisMaxBytes = 1 << 20

// RedisMaxKeyLen is the longest stream key routing.Redis gives out. Redis
// takes keys up to 512 MB; a destination longer than this is a type that
// was not meant as one.
const RedisMaxKeyLen = 1024

// RedisHeaderPrefix starts the stream field of each of an event's own
// headers: header traceparent travels as field "header:traceparent", so
// that no header can shadow the relayer's fields (event_id, payload, ...).
const RedisHeaderPrefix = "header:"

// RedisPayloadField is the stream field that holds the event's payload.
const RedisPayloadField = "payload"

// Redis is the Routing of the Redis Streams sink (relay/redispub).
//
// An event type routes to the stream key TopicPrefix followed by the part
// of the type before its first '.', as on Kafka: "order.placed" goes to
// stream "order" (or "prod:order" with prefix "prod:"). A key must be 1 to
// RedisMaxKeyLen bytes of UTF-8 without spaces or control characters, so
// that it can be typed into redis-cli as it is.
//
// An event's size is the bytes of its stream entry's field names and
// values: event_id, event_type, aggregate_id, content-type, event_source
// (counted at outbox.MaxSourceLen), one "header:<name>" field per header
// of its own, and payload.
type Redis struct {
	// TopicPrefix is prepended to the stream key derived from an event's
	// type. It must match the relayer's. Defaults to "".
	TopicPrefix string
	// MaxBytes is the largest stream entry (see Size) an event may make.
	// Defaults to DefaultRedisMaxBytes (1 MiB).
	MaxBytes int
}

var _ outbox.Routing = Redis{}

// Validate checks that TopicPrefix can start a stream key and that
// MaxBytes (0 for the default) fits the smallest event and Redis's own
// limit.
func (r Redis) Validate() error {
	if least := r.Size("x", 2, nil); r.MaxBytes != 0 && (r.MaxBytes < least || r.MaxBytes > 512<<20) {
		return fmt.Errorf("MaxBytes is %d; use between %d (the smallest event's entry) and %d (Redis's proto-max-bulk-len), or 0 for the default %d", r.MaxBytes, least, 512<<20, DefaultRedisMaxBytes)
	}
	if r.TopicPrefix != "" {
		if err := redisKeyInvalid(r.TopicPrefix + "x"); err != "" {
			return fmt.Errorf("TopicPrefix %q cannot start a stream key: %s", r.TopicPrefix, err)
		}
	}
	return nil
}

// Destination returns the stream key events of eventType go to.
func (r Redis) Destination(eventType string) (string, error) {
	base, _, _ := strings.Cut(eventType, ".")
	if base == "" {
		return "", fmt.Errorf("%w: type %q names no stream (it is empty or starts with '.'); write it as \"stream.event\", e.g. \"order.placed\"", outbox.ErrInvalidTopic, eventType)
	}
	key := r.TopicPrefix + base
	if err := redisKeyInvalid(key); err != "" {
		return "", fmt.Errorf("%w: type %q routes to stream key %q: %s", outbox.ErrInvalidTopic, eventType, key, err)
	}
	return key, nil
}

// redisKeyInvalid says why key is not a stream key this routing gives
// out, or "" when it is one.
func redisKeyInvalid(key string) string {
	if len(key) > RedisMaxKeyLen {
		return fmt.Sprintf("it is %d bytes, more than %d", len(key), RedisMaxKeyLen)
	}
	if !utf8.ValidString(key) {
		return "it is not UTF-8"
	}
	if i := strings.IndexFunc(key, func(c rune) bool { return unicode.IsSpace(c) || unicode.IsControl(c) }); i >= 0 {
		return fmt.Sprintf("it holds %q at byte %d; use no spaces or control characters", key[i:i+1], i)
	}
	return ""
}

// Size is EntrySize with the longest event id and an event_source of
// outbox.MaxSourceLen, so the figure holds whatever id the event gets and
// whatever source a relayer stamps.
func (r Redis) Size(eventType string, payloadLen int, headers map[string]string) int {
	return r.EntrySize(0, eventType, payloadLen, headers, strings.Repeat("x", outbox.MaxSourceLen))
}

// EntrySize is the bytes of the field names and values of one event's
// stream entry: what the relayer compares with MaxBytes. eventID 0 counts
// the longest id; source "" counts no event_source field.
func (r Redis) EntrySize(eventID int64, eventType string, payloadLen int, headers map[string]string, source string) int {
	idLen := len("9223372036854775807")
	if eventID > 0 {
		idLen = len(fmt.Sprint(eventID))
	}
	n := len(outbox.HeaderEventID) + idLen +
		len(outbox.HeaderEventType) + len(eventType) +
		len(outbox.HeaderAggregateID) + 36 +
		len(outbox.HeaderContentType) + len(outbox.ContentTypeJSON) +
		len(RedisPayloadField) + payloadLen
	if source != "" {
		n += len(outbox.HeaderEventSource) + len(source)
	}
	for k, v := range headers {
		n += len(RedisHeaderPrefix) + len(k) + len(v)
	}
	return n
}

// Limit is MaxBytes (DefaultRedisMaxBytes when 0), in Redis's words.
func (r Redis) Limit() outbox.SizeLimit {
	n := r.MaxBytes
	if n <= 0 {
		n = DefaultRedisMaxBytes
	}
	return outbox.SizeLimit{Bytes: n, Unit: "a stream entry", Seen: "counting its field names and values", Raise: "routing.Redis.MaxBytes and the relay's ?max_bytes"}
}
