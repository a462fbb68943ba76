package routing

import (
	"fmt"
	"unicode/utf8"

	"github.com/pgoutbox/outbox"
)

// DefaultAMQPMaxBytes is RabbitMQ's default max_message_size (3.10 and
// later): the largest message body a server accepts, 128 MiB.
const DefaultAMQPMaxBytes = 128 << 20

// MaxRoutingKeyLen is the longest routing key AMQP 0-9-1 can carry: it
// travels as a short string, one length byte.
const MaxRoutingKeyLen = 255

// AMQP is the Routing of the RabbitMQ sink (relay/amqppub).
//
// An event type routes to the routing key TopicPrefix followed by the
// whole type: "order.placed" is published with routing key "order.placed"
// (or "shop.order.placed" with prefix "shop."), so a queue binds to
// "order.*" or "#.placed" as topic exchanges allow. A key is at most 255
// bytes of UTF-8. An event's size is its message body, the payload: what
// RabbitMQ compares with max_message_size.
type AMQP struct {
	// TopicPrefix is prepended to every routing key. It must match the
	// relayer's. Defaults to "".
	TopicPrefix string
	// MaxBytes is the largest message body an event may make; set it to
	// the server's max_message_size. Defaults to DefaultAMQPMaxBytes
	// (128 MiB, RabbitMQ's default).
	MaxBytes int
}

var _ outbox.Routing = AMQP{}

// Validate checks that TopicPrefix can start a routing key and that
// MaxBytes is not negative.
func (a AMQP) Validate() error {
	if a.MaxBytes < 0 {
		return fmt.Errorf("routing.AMQP: MaxBytes is %d; use the server's max_message_size in bytes, or 0 for the default (%d)", a.MaxBytes, DefaultAMQPMaxBytes)
	}
	if err := amqpKeyProblem(a.TopicPrefix + "x"); a.TopicPrefix != "" && err != "" {
		return fmt.Errorf("routing.AMQP: TopicPrefix %q cannot start a routing key: %s", a.TopicPrefix, err)
	}
	return nil
}

// Destination returns the routing key events of eventType are published
// with.
func (a AMQP) Destination(eventType string) (string, error) {
	if eventType == "" {
		return "", fmt.Errorf("%w: the type is empty, so it names no routing key; name it, e.g. \"order.placed\"", outbox.ErrInvalidTopic)
	}
	key := a.TopicPrefix + eventType
	if why := amqpKeyProblem(key); why != "" {
		return "", fmt.Errorf("%w: type %q routes to routing key %q, which %s", outbox.ErrInvalidTopic, amqpShort(eventType), amqpShort(key), why)
	}
	return key, nil
}

// amqpKeyProblem says why key cannot be a routing key, or "" when it can.
func amqpKeyProblem(key string) string {
	switch {
	case len(key) > MaxRoutingKeyLen:
		return fmt.Sprintf("is %d bytes; AMQP routing keys hold at most %d: use a shorter type or prefix", len(key), MaxRoutingKeyLen)
	case !utf8.ValidString(key):
		return "is not valid UTF-8"
	}
	return ""
}

// Size is the message body: the payload as published. RabbitMQ limits
// the body alone; the headers travel in a frame of their own.
func (a AMQP) Size(_ string, payloadLen int, _ map[string]string) int { return payloadLen }

// Limit is MaxBytes (DefaultAMQPMaxBytes when 0), in RabbitMQ's words.
func (a AMQP) Limit() outbox.SizeLimit {
	n := a.MaxBytes
	if n == 0 {
		n = DefaultAMQPMaxBytes
	}
	return outbox.SizeLimit{Bytes: n, Unit: "a message body", Seen: "as RabbitMQ counts it", Raise: "routing.AMQP.MaxBytes and the server's max_message_size"}
}

// amqpShort cuts s for an error message.
func amqpShort(s string) string {
	if len(s) <= 80 {
		return s
	}
	cut := 80
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
