package outbox

import "github.com/pgoutbox/outbox/internal/kafkatopic"

// Topic returns the Kafka topic an event type routes to: prefix followed by
// the part of eventType before its first '.'.
//
// Deprecated: the sink owns routing; use
// KafkaRouting{TopicPrefix: prefix}.Destination(eventType).
func Topic(prefix, eventType string) (string, error) {
	return KafkaRouting{TopicPrefix: prefix}.Destination(eventType)
}

// ValidateTopic checks a name against Kafka's rules for topic names:
// 1 to 249 characters of [a-zA-Z0-9._-], and not "." or "..".
//
// Deprecated: the sink owns its destinations' syntax; KafkaRouting's
// Destination and Validate check Kafka's.
func ValidateTopic(topic string) error { return kafkatopic.Validate(topic) }
