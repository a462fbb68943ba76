package routing

import (
	"fmt"
	"strings"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/webhookwire"
)

// DefaultWebhookMaxBytes is the largest request, body and headers, the
// webhook sink sends by default: Go's http.Server reads headers up to
// 1 MiB, and most endpoints limit bodies near there.
const DefaultWebhookMaxBytes = 1 << 20

// DefaultWebhookSignatures is how many signatures Size counts on a
// request: two, the new and the old secret during a rotation.
const DefaultWebhookSignatures = 2

// Webhook is the Routing of the Standard Webhooks sink (relay/webhookpub).
//
// An event type routes to the topic TopicPrefix followed by the part of
// the type before its first '.', as on Kafka: "order.placed" goes to
// "order"; the sink's routes then map a type or a topic to an endpoint.
// A topic is 1 to 200 characters of [A-Za-z0-9._-]. An event's size is
// its HTTP request: the payload as the body plus every header, the
// event's own percent-encoded (see docs/sinks/webhook.md).
type Webhook struct {
	// TopicPrefix is prepended to the topic derived from an event's type.
	// It must match the relayer's. Defaults to "".
	TopicPrefix string
	// MaxBytes is the largest request an event may make. It must match
	// the relayer's (the sink URL's max_bytes). Defaults to
	// DefaultWebhookMaxBytes (1 MiB).
	MaxBytes int
	// Signatures is how many secrets sign each request, for Size. Defaults
	// to DefaultWebhookSignatures (2).
	Signatures int
	// CloudEvents counts the CloudEvents headers (ce-id, ce-source, ...)
	// at their largest into each event's size: set it when the relayer
	// stamps them (webhookpub.Config.CloudEvents, outbox relay
	// --cloudevents). Defaults to false.
	CloudEvents bool
}

var _ outbox.Routing = Webhook{}

// maxTopicLen is the longest topic Destination returns.
const maxTopicLen = 200

// Validate checks that TopicPrefix can start a topic and that MaxBytes
// (0 for the default) fits the smallest event.
func (w Webhook) Validate() error {
	if least := w.Size("x", 2, nil); w.MaxBytes != 0 && w.MaxBytes < least {
		return fmt.Errorf("routing.Webhook: MaxBytes is %d; the smallest event makes a request of %d bytes, so use at least that, or 0 for %d", w.MaxBytes, least, DefaultWebhookMaxBytes)
	}
	if w.Signatures < 0 {
		return fmt.Errorf("routing.Webhook: Signatures is %d; use the number of secrets that sign, or 0 for %d", w.Signatures, DefaultWebhookSignatures)
	}
	if w.TopicPrefix != "" {
		if err := validTopic(w.TopicPrefix + "x"); err != nil {
			return fmt.Errorf("routing.Webhook: TopicPrefix %q cannot start a topic: %s", w.TopicPrefix, err)
		}
	}
	return nil
}

func validTopic(t string) error {
	if len(t) > maxTopicLen {
		return fmt.Errorf("topic %q is %d characters; at most %d", t[:40]+"…", len(t), maxTopicLen)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic %q holds %q; use only [A-Za-z0-9._-]", t, c)
		}
	}
	return nil
}

// Destination returns the topic events of eventType go to.
func (w Webhook) Destination(eventType string) (string, error) {
	base, _, _ := strings.Cut(eventType, ".")
	if base == "" {
		return "", fmt.Errorf("%w: type %q names no topic (nothing before its first '.'); write it as \"topic.event\", e.g. \"order.placed\"", outbox.ErrInvalidTopic, eventType)
	}
	topic := w.TopicPrefix + base
	if err := validTopic(topic); err != nil {
		return "", fmt.Errorf("%w: type %q routes to %s", outbox.ErrInvalidTopic, eventType, err)
	}
	return topic, nil
}

// worstSource is an event_source of outbox.MaxSourceLen bytes at its
// longest once percent-encoded (three bytes each).
var worstSource = strings.Repeat("%", outbox.MaxSourceLen)

// Size is the event's request at its largest: the longest event id and
// an event_source of MaxSourceLen that all needs encoding.
func (w Webhook) Size(eventType string, payloadLen int, headers map[string]string) int {
	topic, err := w.Destination(eventType)
	if err != nil {
		topic = w.TopicPrefix + eventType
	}
	nsig := w.Signatures
	if nsig <= 0 {
		nsig = DefaultWebhookSignatures
	}
	n := webhookwire.Size(eventType, topic, worstSource, 19, payloadLen, headers, nsig)
	if w.CloudEvents {
		n += CloudEventsHTTPSize(cloudevents.MaxAttributes(eventType))
	}
	return n
}

// CloudEventsHTTPSize is what attrs take on an HTTP request in the HTTP
// binding's binary mode (ce- headers, values percent-encoded).
func CloudEventsHTTPSize(attrs []cloudevents.Attribute) int {
	n := 0
	for _, h := range cloudevents.HTTP.Headers(attrs) {
		n += webhookwire.HeaderLen(h.Name, h.Value)
	}
	return n
}

// Limit is MaxBytes (DefaultWebhookMaxBytes when 0), in HTTP's words.
func (w Webhook) Limit() outbox.SizeLimit {
	n := w.MaxBytes
	if n <= 0 {
		n = DefaultWebhookMaxBytes
	}
	return outbox.SizeLimit{Bytes: n, Unit: "a request", Seen: "as the endpoint receives it (body and headers)",
		Raise: "routing.Webhook.MaxBytes and the relay's --sink ...?max_bytes="}
}
