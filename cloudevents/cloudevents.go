// Package cloudevents maps outbox events to CloudEvents 1.0 context
// attributes in binary content mode: the payload stays the message body,
// unchanged, and each attribute travels as a header of the message, named
// and encoded by the protocol binding of the sink's broker (Kafka, HTTP,
// NATS, AMQP). A consumer that knows CloudEvents, and nothing of the
// outbox, reads an event with its SDK.
//
// The attribute values are common to every sink (Config.Attributes); the
// header names are the sink's, through its Binding:
//
//	id              the event_id (the outbox row id), unique per source
//	                and the same on every redelivery: consumers dedupe
//	                on (source, id)
//	source          Config.Source, naming the outbox
//	type            the event type
//	subject         the aggregate id
//	time            when the row became pending (its created_at)
//	datacontenttype application/json, or a binary payload's content type
//	dataschema      the contract the payload was written against, when
//	                the event has an event_version header
//	specversion     1.0
//
// It links the standard library only, so that routings can size events
// with it.
package cloudevents

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// SpecVersion is the CloudEvents version of every event: the specversion
// attribute.
const SpecVersion = "1.0"

// MaxSourceLen is the longest Source, and MaxDataSchemaLen the longest
// DataSchema, a Config accepts: producers size events for them.
const (
	MaxSourceLen     = 200
	MaxDataSchemaLen = 200
)

// Attribute names.
const (
	AttrID              = "id"
	AttrSource          = "source"
	AttrType            = "type"
	AttrSubject         = "subject"
	AttrTime            = "time"
	AttrDataContentType = "datacontenttype"
	AttrDataSchema      = "dataschema"
	AttrSpecVersion     = "specversion"
)

// DataSchemaURN starts the dataschema of an event when Config.DataSchema
// is empty: urn:outbox:contract:<type>:v<version>.
const DataSchemaURN = "urn:outbox:contract:"

// Config is what a sink needs to stamp CloudEvents attributes.
type Config struct {
	// Source is the source attribute: a URI-reference naming the outbox
	// (see DefaultSource). The id is unique only within one outbox, so two
	// outboxes must not share a source. Required; at most MaxSourceLen
	// bytes.
	Source string
	// DataSchema, when set, is an absolute URI ending in '/' under which
	// the contracts are served in their directory layout: an event of
	// type order.placed at version 2 gets dataschema
	// <DataSchema>order.placed/v2.schema.json. Defaults to "": the
	// dataschema is urn:outbox:contract:order.placed:v2 (DataSchemaURN).
	DataSchema string
}

// Validate reports what keeps c from making valid attributes, saying
// what to set instead.
func (c Config) Validate() error {
	if c.Source == "" {
		return errors.New("cloudevents: Source is empty; name the outbox with a URI-reference, e.g. urn:outbox:orders or /outbox/orders")
	}
	if len(c.Source) > MaxSourceLen {
		return fmt.Errorf("cloudevents: Source is %d bytes; use at most %d (producers size events for that)", len(c.Source), MaxSourceLen)
	}
	if why := uriFault(c.Source); why != "" {
		return fmt.Errorf("cloudevents: Source %q is not a URI-reference: %s; e.g. urn:outbox:orders or /outbox/orders", c.Source, why)
	}
	if c.DataSchema != "" {
		if len(c.DataSchema) > MaxDataSchemaLen {
			return fmt.Errorf("cloudevents: DataSchema is %d bytes; use at most %d", len(c.DataSchema), MaxDataSchemaLen)
		}
		u, err := url.Parse(c.DataSchema)
		if why := uriFault(c.DataSchema); why != "" || err != nil || !u.IsAbs() || !strings.HasSuffix(c.DataSchema, "/") {
			return fmt.Errorf("cloudevents: DataSchema %q: use an absolute URI ending in '/', e.g. https://example.com/contracts/, under which the contracts directory is served", c.DataSchema)
		}
	}
	return nil
}

// uriFault says why s cannot be a URI-reference as it is, or "".
func uriFault(s string) string {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"<>\\^`{|}", c) >= 0 {
			return fmt.Sprintf("it holds %q, which a URI must percent-encode", c)
		}
	}
	if _, err := url.Parse(s); err != nil {
		return "it does not parse"
	}
	return ""
}

// DefaultSource is the source of an outbox named name (the relay's
// event_source, or its database and table): urn:outbox:<name>, with the
// name percent-encoded where a URN needs it.
func DefaultSource(name string) string {
	return "urn:outbox:" + url.PathEscape(name)
}

// Event is what the attributes are made of: one outbox event.
type Event struct {
	// ID is the outbox row id.
	ID int64
	// Type is the event type.
	Type string
	// Subject is the aggregate id, as text.
	Subject string
	// Time is when the row became pending; the zero time sends no time
	// attribute.
	Time time.Time
	// Version is the event_version header, "" when the event has none.
	Version string
	// DataContentType is a binary payload's content type (outbox.Bytes);
	// "" for a JSON payload, whose datacontenttype is application/json.
	DataContentType string
}

// Attribute is one context attribute, by its CloudEvents name and its
// canonical string value.
type Attribute struct {
	Name, Value string
}

// Attributes returns the context attributes of e, in a fixed order.
func (c Config) Attributes(e Event) []Attribute {
	attrs := make([]Attribute, 0, 8)
	attrs = append(attrs,
		Attribute{AttrSpecVersion, SpecVersion},
		Attribute{AttrID, strconv.FormatInt(e.ID, 10)},
		Attribute{AttrSource, c.Source},
		Attribute{AttrType, e.Type},
		Attribute{AttrSubject, e.Subject},
	)
	if !e.Time.IsZero() {
		attrs = append(attrs, Attribute{AttrTime, e.Time.UTC().Format(time.RFC3339Nano)})
	}
	ct := e.DataContentType
	if ct == "" {
		ct = "application/json"
	}
	attrs = append(attrs, Attribute{AttrDataContentType, ct})
	if e.Version != "" {
		attrs = append(attrs, Attribute{AttrDataSchema, c.dataSchema(e.Type, e.Version)})
	}
	return attrs
}

// DataSchemaOf is the dataschema of an event of type typ written against
// contract version version.
func (c Config) DataSchemaOf(typ string, version int) string {
	return c.dataSchema(typ, strconv.Itoa(version))
}

func (c Config) dataSchema(typ, version string) string {
	if c.DataSchema == "" {
		return DataSchemaURN + url.PathEscape(typ) + ":v" + url.PathEscape(version)
	}
	return c.DataSchema + url.PathEscape(typ) + "/v" + url.PathEscape(version) + ".schema.json"
}

// MaxAttributes are the attributes of an event of type eventType at their
// largest, for sizing an event before it exists: the longest id, time and
// subject, a Source and a DataSchema of their longest made of '%' (three
// bytes each once percent-encoded), and a version of 19 digits.
func MaxAttributes(eventType string) []Attribute {
	worst := Config{Source: strings.Repeat("%", MaxSourceLen), DataSchema: strings.Repeat("%", MaxDataSchemaLen)}
	return worst.Attributes(Event{
		ID: 1<<63 - 1, Type: eventType, Subject: strings.Repeat("0", 36),
		Time:    time.Date(2000, 1, 1, 0, 0, 0, 1, time.UTC),
		Version: strings.Repeat("%", 19),
	})
}

// Binding is how a protocol binding carries the attributes as headers.
type Binding struct {
	// Prefix starts every attribute's header name.
	Prefix string
	// ContentType, when set, is true of bindings that carry
	// datacontenttype in the transport's own content type (which the sink
	// sets already) rather than as a prefixed header.
	ContentType bool
	// PercentEncode is true of bindings whose header values are
	// percent-encoded (PercentEncode).
	PercentEncode bool
}

// The bindings of the sinks: Kafka's (ce_ headers, content-type), HTTP's
// (ce- headers, Content-Type, percent-encoded values), NATS's (ce-
// headers, ce-datacontenttype too, percent-encoded values) and AMQP's
// (cloudEvents_ application properties, the content-type property).
var (
	Kafka = Binding{Prefix: "ce_", ContentType: true}
	HTTP  = Binding{Prefix: "ce-", ContentType: true, PercentEncode: true}
	NATS  = Binding{Prefix: "ce-", PercentEncode: true}
	AMQP  = Binding{Prefix: "cloudEvents_", ContentType: true}
)

// Headers returns attrs as the binding's headers: (name, value) pairs in
// attrs' order.
func (b Binding) Headers(attrs []Attribute) []Attribute {
	out := make([]Attribute, 0, len(attrs))
	for _, a := range attrs {
		if b.ContentType && a.Name == AttrDataContentType {
			continue
		}
		v := a.Value
		if b.PercentEncode {
			v = PercentEncode(v)
		}
		out = append(out, Attribute{b.Prefix + a.Name, v})
	}
	return out
}

// WithMaxHeaders returns headers with the binding's headers of
// MaxAttributes(eventType) added: what a routing sizes an event with when
// the relayer stamps CloudEvents attributes.
func (b Binding) WithMaxHeaders(eventType string, headers map[string]string) map[string]string {
	return b.With(MaxAttributes(eventType), headers)
}

// With returns a copy of headers with the binding's headers of attrs
// added, replacing any of the same name.
func (b Binding) With(attrs []Attribute, headers map[string]string) map[string]string {
	out := make(map[string]string, len(headers)+len(attrs))
	for k, v := range headers {
		out[k] = v
	}
	for _, h := range b.Headers(attrs) {
		out[h.Name] = h.Value
	}
	return out
}

// PercentEncode encodes v as the HTTP and NATS bindings ask: space,
// double quote, '%' and every byte outside printable ASCII become %XX
// (upper-case hex), UTF-8 byte by byte.
func PercentEncode(v string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c <= ' ' || c >= 0x7f || c == '"' || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
