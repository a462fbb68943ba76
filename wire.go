package outbox

// The wire contract: what every published record carries besides the
// event's own headers. The relayer writes these headers, Emit refuses them
// as user headers, and consumers read them.
const (
	// HeaderEventID is the outbox row id in decimal: the event's identity,
	// which consumers deduplicate on.
	HeaderEventID = "event_id"
	// HeaderEventType is the event's Type.
	HeaderEventType = "event_type"
	// HeaderContentType is ContentTypeJSON, or a binary payload's
	// content type (Bytes.ContentType).
	HeaderContentType = "content-type"
	// HeaderEventSource names the outbox a record came from, when the
	// relayer is given a source. event_id is unique only within one outbox;
	// consumers make (source, event_id) their dedupe key.
	HeaderEventSource = "event_source"
	// HeaderAggregateID is the event's aggregate id, in its text form, on
	// sinks whose messages have no key (NATS, RabbitMQ, Redis Streams,
	// webhooks); Kafka carries it as the record key. Those sinks hold an
	// event whose own headers use this name (relay.ReasonReservedHeader).
	HeaderAggregateID = "aggregate_id"
)

// HeaderEventVersion is the version of the event type's contract that the
// payload was written (and checked) against, in decimal. Emit writes it
// into the row's headers from Event.Version, or from the version its
// Config.Contracts checked; producers that insert with SQL set it in the
// row's headers themselves. Consumers pick an upcaster by it.
const HeaderEventVersion = "event_version"

// HeaderEventVersions lists, on each row of a dual emit
// (Producer.EmitVersions), every version emitted together for the one
// logical event: ascending decimals separated by commas, e.g. "1,2". A
// consumer that reads one version applies the row of that version and
// skips the others (consumer.Upcasters.Want does); a consumer that reads
// every row sees the event once per version. Emit refuses it as a user
// header.
const HeaderEventVersions = "event_versions"

// ContentTypeJSON is the value of the content-type header of a JSON
// payload.
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
