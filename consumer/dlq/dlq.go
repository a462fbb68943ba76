// Package dlq inspects a consumer's dead letters and sends them back to
// the destination they were consumed from, once their cause is fixed:
// `outbox dlq list` and `outbox dlq replay` run it. A consumer writes a
// dead letter when it can never process a message as it is (malformed, or
// its handler failed every attempt); the dead letter is not recorded as
// processed, so a replayed event is processed once, and an event that was
// processed meanwhile (replayed twice, say) is skipped as a duplicate.
//
// Each transport keeps its dead letters its own way; a Store reads and
// replays one transport's. Kafka is the Kafka consumer's (a dead-letter
// topic per topic, <topic>.dlq by default); the other transports' stores
// are in their consumer packages (natsconsumer.NewDeadLetters, ...).
//
//	store, err := dlq.NewKafka(kafka.ClientConfig{Brokers: []string{"localhost:9092"}})
//	letters, err := store.List(ctx, "order.dlq")
//	sent, err := store.Replay(ctx, letters)
package dlq

import (
	"context"
	"fmt"
	"strconv"
)

// Letter is one dead letter.
type Letter struct {
	// Destination is the dead-letter destination the letter was read
	// from, and Position where in it: "partition/offset" on Kafka.
	Destination, Position string
	// OriginalTopic is where the message was consumed from: where Replay
	// sends it.
	OriginalTopic string
	// EventID, Type and Source are the event's, from its headers; EventID
	// is 0 when the message had no valid event_id (a malformed one).
	EventID      int64
	Type, Source string
	// Consumer is the name of the consumer that gave up on the message,
	// Attempts how often its handler ran (0: malformed), Error why.
	Consumer string
	Attempts int
	Error    string
	// Key, Payload and Headers are the original message's, the dead-letter
	// headers removed, Headers in their order.
	Key     []byte
	Payload []byte
	Headers []Header
	// ValueDropped, when positive, is the length of the original payload
	// the dead letter could not hold (a pointer record): Replay refuses
	// it; replay the event from the outbox table instead ('outbox events
	// replay'), or read it from the original topic while retention keeps
	// it. HeadersDropped counts the original headers a pointer record
	// dropped too.
	ValueDropped, HeadersDropped int
}

// Header is one message header.
type Header struct{ Key, Value string }

// Replayable says why the letter cannot be sent back as it was, or nil.
func (l Letter) Replayable() error {
	switch {
	case l.ValueDropped > 0:
		return fmt.Errorf("dead letter %s of %s holds no payload (its %d bytes did not fit the dead letter); replay event %d from the outbox instead: outbox events replay --from-id %d --to-id %d",
			l.Position, l.Destination, l.ValueDropped, l.EventID, l.EventID, l.EventID)
	case l.OriginalTopic == "":
		return fmt.Errorf("dead letter %s of %s does not say where it was consumed from (no dlq_original_* header): it was not written by an outbox consumer", l.Position, l.Destination)
	}
	return nil
}

// Store reads and replays the dead letters of one transport.
type Store interface {
	// List returns every dead letter in dest, in the order dest keeps
	// them (on Kafka: partition by partition, each in offset order).
	List(ctx context.Context, dest string) ([]Letter, error)
	// Replay sends each letter back to its OriginalTopic, in order, as
	// it was first delivered (key, payload, headers), and returns how
	// many it sent before an error. It refuses, before sending anything,
	// letters that are not Replayable.
	Replay(ctx context.Context, letters []Letter) (sent int, err error)
	// Close releases the store's connections.
	Close()
}

// Filter keeps the letters that match every condition set.
type Filter struct {
	// Consumer, when set, keeps the letters of that consumer name.
	Consumer string
	// EventIDs, when set, keeps the letters of those events.
	EventIDs []int64
}

// Apply returns the letters f keeps, in order.
func (f Filter) Apply(letters []Letter) []Letter {
	var out []Letter
	for _, l := range letters {
		if f.Consumer != "" && l.Consumer != f.Consumer {
			continue
		}
		if len(f.EventIDs) > 0 && !contains(f.EventIDs, l.EventID) {
			continue
		}
		out = append(out, l)
	}
	return out
}

func contains(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// atoi is strconv.Atoi for header values, 0 when not a number.
func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
