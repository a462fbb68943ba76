package outbox

import (
	"fmt"
	"strings"
)

// maxTopicLen is Kafka's limit on topic names.
const maxTopicLen = 249

// Topic returns the Kafka topic an event type routes to: prefix followed by
// the part of eventType before its first '.', so "order.placed" goes to
// "order" (or "prod.order" with prefix "prod."). The relayer and Emit use the
// same rule, so a type Emit accepts is a type the relayer can publish.
func Topic(prefix, eventType string) (string, error) {
	if eventType == "" {
		return "", fmt.Errorf("%w: the type is empty, so it names no topic; write it as \"topic.event\", e.g. \"order.placed\"", ErrInvalidTopic)
	}
	base, _, _ := strings.Cut(eventType, ".")
	if base == "" {
		return "", fmt.Errorf("%w: type %s starts with '.', so it names no topic; write it as \"topic.event\", e.g. \"order.placed\"", ErrInvalidTopic, quoteShort(eventType))
	}
	topic := prefix + base
	if err := ValidateTopic(topic); err != nil {
		return "", fmt.Errorf("%w: type %s routes to %s", ErrInvalidTopic, quoteShort(eventType), err)
	}
	return topic, nil
}

// ValidateTopic checks a name against Kafka's rules for topic names:
// 1 to 249 characters of [a-zA-Z0-9._-], and not "." or "..".
func ValidateTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("an empty topic name")
	case topic == "." || topic == "..":
		return fmt.Errorf("topic %q, which Kafka reserves", topic)
	case len(topic) > maxTopicLen:
		return fmt.Errorf("a topic name of %d characters; Kafka allows at most %d", len(topic), maxTopicLen)
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic %q with the character %q; Kafka topics use only letters, digits, '.', '_' and '-'", topic, c)
		}
	}
	return nil
}
