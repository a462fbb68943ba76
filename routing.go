package outbox

// Routing is what a sink decides about an event before Emit writes it:
// where events of a type go, and how large an event becomes on the sink
// against the sink's limit. Emit asks it alone, so a type or a size the
// sink would refuse is refused at write time, while the caller can still
// fix it, and never becomes a stuck row. The relayer asks the same sink's
// Routing (relay.Sink) for each row's destination: the two must agree, as
// TopicPrefix on both sides agrees today.
//
// KafkaRouting is the default. A Routing must be safe for concurrent use.
type Routing interface {
	// Destination returns the sink's destination for events of
	// eventType (relay.Message.Topic), or an error wrapping
	// ErrInvalidTopic that says why there is none and how to name the
	// type instead. eventType is not empty.
	Destination(eventType string) (string, error)
	// Size returns the most bytes an event takes on the sink, as the sink
	// compares it with its limit: eventType, a payload of payloadLen bytes
	// (Postgres' JSONB text of it, as published), the event's own headers,
	// and everything the relayer adds at its largest (any event_id, an
	// event_source of MaxSourceLen).
	Size(eventType string, payloadLen int, headers map[string]string) int
	// Limit returns the largest Size the sink accepts, with the words
	// Emit's error uses for it.
	Limit() SizeLimit
}

// SizeLimit is a sink's largest event, in the sink's words. Emit refuses a
// larger one with ErrPayloadTooLarge, saying: type "t" makes <Unit> of
// <size> <Seen>, of which ...; the limit is <Bytes>: set <Raise> higher,
// or shrink the event.
type SizeLimit struct {
	// Bytes is the largest Size accepted; 0 or less means no limit.
	Bytes int
	// Unit is what an event becomes on the sink, with its article: "a
	// record" for Kafka.
	Unit string
	// Seen says whose measure the size is: "as the broker will see it"
	// for Kafka.
	Seen string
	// Raise names the settings that raise the limit: "MaxRecordBytes and
	// the topic's max.message.bytes" for Kafka.
	Raise string
}
