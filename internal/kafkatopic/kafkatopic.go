// Package kafkatopic holds Kafka's rules for topic names, shared by the
// producer's Kafka routing, the Kafka sink and the consumer, without
// linking a Kafka client.
package kafkatopic

import "fmt"

// MaxLen is Kafka's limit on topic names.
const MaxLen = 249

// Validate checks a name against Kafka's rules for topic names: 1 to 249
// characters of [a-zA-Z0-9._-], and not "." or "..".
func Validate(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("an empty topic name")
	case topic == "." || topic == "..":
		return fmt.Errorf("topic %q, which Kafka reserves", topic)
	case len(topic) > MaxLen:
		return fmt.Errorf("a topic name of %d characters; Kafka allows at most %d", len(topic), MaxLen)
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic %q with the character %q; Kafka topics use only letters, digits, '.', '_' and '-'", topic, c)
		}
	}
	return nil
}
