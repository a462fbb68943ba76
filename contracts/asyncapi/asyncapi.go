// Package asyncapi describes an outbox's events as an AsyncAPI 3.0.0
// document: one channel per destination the sink's routing gives the
// contracted types, one message per type and version with its contract as
// payload schema and the relayer's headers as headers schema, and one
// send operation per channel. `outbox contracts asyncapi` writes it.
//
//	set, _ := contracts.Load("contracts")
//	doc, err := asyncapi.Build(set, os.DirFS("contracts"), asyncapi.Options{
//		Routing: outbox.KafkaRouting{}, Protocol: "kafka"})
//	b, _ := json.MarshalIndent(doc, "", "  ")
package asyncapi

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/contracts"
)

// Version is the AsyncAPI version of the documents Build makes.
const Version = "3.0.0"

// kafkaBindingVersion is the version of the Kafka bindings Build writes.
const kafkaBindingVersion = "0.5.0"

// Options say what the document describes besides the contracts.
type Options struct {
	// Title and Version are the document's info. Default to "outbox
	// events" and "1.0.0".
	Title, Version string
	// Routing is the sink's routing (with the relayer's topic prefix):
	// it names each type's channel. Required.
	Routing outbox.Routing
	// Protocol is the sink's protocol as AsyncAPI names it (kafka, nats,
	// amqp, redis, http, https). Kafka gets Kafka bindings (the record
	// key is the aggregate id). Defaults to "kafka".
	Protocol string
	// Host, when set, describes the broker as the document's one server.
	// Defaults to "" (no servers).
	Host string
	// CloudEvents, when set, adds the CloudEvents headers the relayer
	// stamps with --cloudevents, in this binding's names. Defaults to nil.
	CloudEvents *cloudevents.Binding
	// AggregateHeader adds the aggregate_id header, which every sink but
	// Kafka (whose record key carries it) sets. Defaults to false.
	AggregateHeader bool
}

// Build returns the AsyncAPI document of set's contracts as a JSON
// value. fsys is the contracts directory, for the files a contract
// $refs: they are embedded under components/schemas and the $refs
// pointed at them.
func Build(set *contracts.Set, fsys fs.FS, o Options) (map[string]any, error) {
	if o.Routing == nil {
		return nil, errors.New("asyncapi: Options.Routing is nil; pass the sink's routing, e.g. outbox.KafkaRouting{}")
	}
	if o.Title == "" {
		o.Title = "outbox events"
	}
	if o.Version == "" {
		o.Version = "1.0.0"
	}
	if o.Protocol == "" {
		o.Protocol = "kafka"
	}
	types := set.Types()
	if len(types) == 0 {
		return nil, errors.New("asyncapi: the contracts directory holds no event type (one folder per type, holding v1.schema.json, ...)")
	}
	e := &embedder{fsys: fsys, schemas: map[string]any{}}
	channels, messages := map[string]any{}, map[string]any{}
	for _, t := range types {
		if err := addType(t, o, e, channels, messages); err != nil {
			return nil, err
		}
	}
	operations := map[string]any{}
	for chID, c := range channels {
		var refs []any
		ids := keys(c.(map[string]any)["messages"].(map[string]any))
		for _, id := range ids {
			refs = append(refs, map[string]any{"$ref": "#/channels/" + chID + "/messages/" + id})
		}
		operations["send."+chID] = map[string]any{
			"action":   "send",
			"summary":  "The outbox relay publishes the events of " + c.(map[string]any)["address"].(string) + ".",
			"channel":  map[string]any{"$ref": "#/channels/" + chID},
			"messages": refs,
		}
	}
	doc := map[string]any{
		"asyncapi":           Version,
		"info":               map[string]any{"title": o.Title, "version": o.Version},
		"defaultContentType": outbox.ContentTypeJSON,
		"channels":           channels,
		"operations":         operations,
		"components":         map[string]any{"messages": messages, "schemas": e.schemas},
	}
	if o.Host != "" {
		doc["servers"] = map[string]any{"broker": map[string]any{"host": o.Host, "protocol": o.Protocol}}
	}
	return doc, nil
}

// addType adds type t's channel (unless another type made it) and one
// message per version, its contract embedded by e.
func addType(t *contracts.Type, o Options, e *embedder, channels, messages map[string]any) error {
	name := t.Name
	dest, err := o.Routing.Destination(name)
	if err != nil {
		return fmt.Errorf("asyncapi: type %s: %w", name, err)
	}
	chID := ident(dest)
	ch, ok := channels[chID].(map[string]any)
	if !ok {
		ch = map[string]any{"address": dest, "messages": map[string]any{}}
		if o.Protocol == "kafka" {
			ch["bindings"] = map[string]any{"kafka": map[string]any{"topic": dest, "bindingVersion": kafkaBindingVersion}}
		}
		channels[chID] = ch
	}
	for _, v := range t.Versions {
		msgID := ident(name) + ".v" + strconv.Itoa(v.Number)
		schemaID, err := e.embed(v.Path, v.Doc)
		if err != nil {
			return fmt.Errorf("asyncapi: %s: %w", v.Path, err)
		}
		msg := map[string]any{
			"name":        name,
			"title":       fmt.Sprintf("%s, version %d", name, v.Number),
			"contentType": outbox.ContentTypeJSON,
			"headers":     headers(name, v.Number, o),
			"payload":     map[string]any{"$ref": "#/components/schemas/" + schemaID},
		}
		if o.Protocol == "kafka" {
			msg["bindings"] = map[string]any{"kafka": map[string]any{
				"key":            map[string]any{"type": "string", "format": "uuid", "description": "the aggregate id"},
				"bindingVersion": kafkaBindingVersion,
			}}
		}
		messages[msgID] = msg
		ch["messages"].(map[string]any)[msgID] = map[string]any{"$ref": "#/components/messages/" + msgID}
	}
	return nil
}

// headers is the schema of the headers the relayer sets on an event of
// type typ at version v.
func headers(typ string, v int, o Options) map[string]any {
	str := func(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }
	props := map[string]any{
		outbox.HeaderEventID:      map[string]any{"type": "string", "pattern": "^[0-9]+$", "description": "the outbox row id: consumers dedupe on it (with event_source)"},
		outbox.HeaderEventType:    map[string]any{"type": "string", "const": typ},
		outbox.HeaderEventVersion: map[string]any{"type": "string", "const": strconv.Itoa(v), "description": "the contract version the payload was checked against"},
		outbox.HeaderContentType:  map[string]any{"type": "string", "const": outbox.ContentTypeJSON},
		outbox.HeaderEventSource:  str("names the outbox, when the relay is given --source"),
	}
	required := []any{outbox.HeaderEventID, outbox.HeaderEventType, outbox.HeaderContentType}
	if o.AggregateHeader {
		props[outbox.HeaderAggregateID] = map[string]any{"type": "string", "format": "uuid"}
		required = append(required, outbox.HeaderAggregateID)
	}
	if o.CloudEvents != nil {
		attrs := []cloudevents.Attribute{
			{Name: cloudevents.AttrSpecVersion}, {Name: cloudevents.AttrID}, {Name: cloudevents.AttrSource},
			{Name: cloudevents.AttrType}, {Name: cloudevents.AttrSubject}, {Name: cloudevents.AttrTime},
			{Name: cloudevents.AttrDataContentType}, {Name: cloudevents.AttrDataSchema},
		}
		for _, h := range o.CloudEvents.Headers(attrs) {
			attr := strings.TrimPrefix(h.Name, o.CloudEvents.Prefix)
			props[h.Name] = str("CloudEvents " + attr + " (outbox relay --cloudevents)")
			if attr != cloudevents.AttrTime && attr != cloudevents.AttrDataSchema {
				required = append(required, h.Name)
			}
		}
	}
	return map[string]any{"type": "object", "properties": props, "required": required}
}

// embedder puts contract files under components/schemas, pointing their
// $refs at the embedded copies.
type embedder struct {
	fsys    fs.FS
	schemas map[string]any
}

// embed adds the schema of file p (decoded as doc, or read when nil) and
// returns its id under components/schemas.
func (e *embedder) embed(p string, doc any) (string, error) {
	id := ident(strings.TrimSuffix(p, ".json"))
	if _, ok := e.schemas[id]; ok {
		return id, nil
	}
	e.schemas[id] = nil // taken, for cycles
	if doc == nil {
		if e.fsys == nil {
			return "", fmt.Errorf("$ref to %s, and no contracts directory to read it from", p)
		}
		raw, err := fs.ReadFile(e.fsys, p)
		if err != nil {
			return "", err
		}
		if doc, err = decode(raw); err != nil {
			return "", fmt.Errorf("%s: %w", p, err)
		}
	}
	out, err := e.rewrite(p, id, doc, true)
	if err != nil {
		return "", err
	}
	e.schemas[id] = out
	return id, nil
}

// rewrite copies v, pointing each $ref at components/schemas: a local
// one ("#/$defs/x") into the copy of its own file (id), one to another
// file of the directory into that file's copy.
func (e *embedder) rewrite(p, id string, v any, top bool) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			if top && (k == "$schema" || k == "$id") {
				continue // AsyncAPI's schema format names its own dialect
			}
			if s, ok := val.(string); ok && k == "$ref" {
				ref, err := e.ref(p, id, s)
				if err != nil {
					return nil, err
				}
				out[k] = ref
				continue
			}
			c, err := e.rewrite(p, id, val, false)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, val := range x {
			c, err := e.rewrite(p, id, val, false)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	}
	return v, nil
}

func (e *embedder) ref(p, id, ref string) (string, error) {
	file, frag, _ := strings.Cut(ref, "#")
	if file == "" {
		return "#/components/schemas/" + id + frag, nil
	}
	if strings.Contains(file, ":") {
		return "", fmt.Errorf("$ref %s is outside the contracts directory", ref)
	}
	target := path.Join(path.Dir(p), file)
	tid, err := e.embed(target, nil)
	if err != nil {
		return "", err
	}
	return "#/components/schemas/" + tid + frag, nil
}

// ident makes s an AsyncAPI component key: [A-Za-z0-9._-], others as '_'.
func ident(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	return string(b)
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
