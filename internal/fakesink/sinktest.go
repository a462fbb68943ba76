// Package fakesink holds what the tests' fake sinks share: the Kafka
// sink's routing for fakes that stand in for it, and a routing with rules
// unlike Kafka's, which shows that producers and sources ask the sink's
// routing rather than Kafka's rules.
package fakesink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatopic"
	"github.com/pgoutbox/outbox/relay"
)

// Kafka gives a fake sink the Routing and ErrorCode of relay.Sink as the
// Kafka sink has them (outbox.KafkaRouting, and the same refusal of a
// prefix that cannot start a topic name); a fake embeds it and writes
// Publish.
type Kafka struct{}

// Routing is outbox.KafkaRouting for prefix.
func (Kafka) Routing(prefix string) (outbox.Routing, error) {
	if err := kafkatopic.Validate(prefix + "x"); prefix != "" && err != nil {
		return nil, fmt.Errorf("topic prefix %q cannot start a topic name: %s", prefix, err)
	}
	return outbox.KafkaRouting{TopicPrefix: prefix}, nil
}

// ErrorCode names every error "other".
func (Kafka) ErrorCode(error) string { return "other" }

// PathLimit is PathRouting's limit on an event's size.
const PathLimit = 100

// PathRouting is a routing whose rules are not Kafka's: an event type
// "orders-eu.placed" goes to Prefix+"orders/eu" (the part before the first
// '.', each '-' a '/'), a prefix may hold '/', a type with '_' before its
// first '.' has no destination, and an event's size is the length of its
// type, payload and headers, limited to PathLimit bytes. Its types still
// pass the outbox table's insert guard, which checks Kafka's syntax.
type PathRouting struct {
	Prefix string
}

var _ outbox.Routing = PathRouting{}

// Destination is Prefix and the type up to its first '.', '-' made '/'.
func (r PathRouting) Destination(eventType string) (string, error) {
	base, _, _ := strings.Cut(eventType, ".")
	if base == "" || strings.Contains(base, "_") {
		return "", fmt.Errorf("%w: type %q names no path; write it as \"dir-dir.event\", without '_'", outbox.ErrInvalidTopic, eventType)
	}
	return r.Prefix + strings.ReplaceAll(base, "-", "/"), nil
}

// Size counts the type, the payload and the headers, nothing else.
func (PathRouting) Size(eventType string, payloadLen int, headers map[string]string) int {
	n := len(eventType) + payloadLen
	for k, v := range headers {
		n += len(k) + len(v)
	}
	return n
}

// Limit is PathLimit bytes of a request body.
func (PathRouting) Limit() outbox.SizeLimit {
	return outbox.SizeLimit{Bytes: PathLimit, Unit: "a body", Seen: "as the endpoint will see it", Raise: "the endpoint's body limit"}
}

// Path gives a fake sink PathRouting (a prefix may not hold a ':') and
// the ErrorCode "path_error".
type Path struct{}

// Routing is PathRouting for prefix.
func (Path) Routing(prefix string) (outbox.Routing, error) {
	if strings.Contains(prefix, ":") {
		return nil, fmt.Errorf("path prefix %q holds a ':'", prefix)
	}
	return PathRouting{Prefix: prefix}, nil
}

// ErrorCode names every error "path_error".
func (Path) ErrorCode(error) string { return "path_error" }

// PathSink is a sink of PathRouting that keeps what it is given and
// acknowledges it, except that each id in FailOnce fails once, with an
// error a retry may fix.
type PathSink struct {
	Path
	FailOnce map[int64]bool

	mu  sync.Mutex
	got []relay.Message
}

// Publish keeps msgs, failing those of FailOnce the first time.
func (s *PathSink) Publish(_ context.Context, msgs []relay.Message) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if s.FailOnce[m.ID] {
			delete(s.FailOnce, m.ID)
			errs[i] = errors.New("the endpoint is busy")
			continue
		}
		m.Payload = slices.Clone(m.Payload)
		s.got = append(s.got, m)
	}
	return errs
}

// Got returns the messages acknowledged so far, in order.
func (s *PathSink) Got() []relay.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}
