package sinktest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/relay"
)

// Harness is one sink as the suite drives it.
type Harness struct {
	// Name names the sink in the suite's messages. Required.
	Name string
	// New builds a fresh sink for one case, on a server or namespace of
	// its own, torn down when t ends (t.Cleanup). Required.
	New func(t *testing.T) *Sink
	// KnownDefects maps the name of a case the sink fails to what fails:
	// Run skips it with "known defect: ...", so the sink's tests stay
	// green while the finding is open and the entry says what to remove
	// once it is fixed. Defaults to none.
	KnownDefects map[string]string
}

// Sink is one case's sink: the sink under test, how to read back what it
// delivered, and the faults it can be made to show. Sink and Read are
// required; every other field is an optional capability, and a
// case that needs one the sink lacks is skipped, saying which.
type Sink struct {
	// Sink is the sink under test.
	Sink relay.Sink
	// Read returns every message that reached dest, in the order dest
	// holds them (at least per aggregate: messages of different
	// aggregates may come in any order), duplicates included. want is
	// how many the suite expects at least: a sink whose acknowledged
	// messages become readable only after a while waits for that many
	// (then a short quiet spell, to see duplicates) and, when fewer come
	// within its own timeout, returns what it has. Read on a destination
	// nothing reached returns nothing.
	Read func(t *testing.T, dest string, want int) []Delivered

	// MaxBytes is the size limit the sink enforces: a message whose
	// payload is larger than MaxBytes bytes must fail alone, permanently,
	// with relay.ReasonTooLarge, and messages whose payloads are 2/5 of
	// it must go through, several in one call. 0: no limit declared, and
	// the size case is skipped. The other cases' messages stay under
	// 32 KiB, headers included: a sink must take those.
	MaxBytes int
	// FailDestination makes every publish to dest fail with an error a
	// retry may fix (the server unreachable, a partition without its
	// leader), until heal is called.
	FailDestination func(t *testing.T, dest string) (heal func())
	// RefuseDestination makes dest refuse every message from now on, as
	// a server refuses a destination that does not exist or that the
	// sink may not write to.
	RefuseDestination func(t *testing.T, dest string)
	// FailMessage makes every publish of the message with this id (on
	// dest) fail with an error a retry may fix, until heal is called. The
	// failure may take down the request the message is in: only its
	// aggregate's later messages are then held to account.
	FailMessage func(t *testing.T, dest string, id int64) (heal func())
	// RefuseMessage makes the server refuse the message with this id (on
	// dest) for good, as it refuses a corrupt or forbidden record: the
	// sink must tell it apart from the messages that shared its request.
	RefuseMessage func(t *testing.T, dest string, id int64)
}

// Delivered is one message as read back from a destination.
type Delivered struct {
	// ID is the event id as the destination carries it: what a
	// deduplicating consumer keys on (the event_id header on Kafka). 0
	// when it is missing.
	ID int64
	// Key is the aggregate id as the destination carries it, in its text
	// form (the record key on Kafka).
	Key string
	// Type is the event type as the destination carries it.
	Type string
	// Payload is the delivered body.
	Payload []byte
	// Headers are the delivered headers; the sink's own (event_id,
	// event_type, ...) may be among them.
	Headers map[string]string
}

// testCase is one check of the suite; its name is the subtest's.
type testCase struct {
	Name string
	Run  func(t *testing.T, h Harness)
}

// cases lists every case Run runs, in order.
var cases = []testCase{
	{"Delivers", delivers},
	{"PayloadAndHeadersExact", payloadAndHeadersExact},
	{"TransientMessageFailure", transientMessageFailure},
	{"TransientDestinationFailure", transientDestinationFailure},
	{"AggregateAcrossDestinations", aggregateAcrossDestinations},
	{"PermanentMessageRefusal", permanentMessageRefusal},
	{"PermanentDestinationRefusal", permanentDestinationRefusal},
	{"SizeLimit", sizeLimit},
}

// Run runs every case against the sink h builds, each as a parallel
// subtest with a sink of its own: Delivers, PayloadAndHeadersExact,
// TransientMessageFailure, TransientDestinationFailure,
// AggregateAcrossDestinations, PermanentMessageRefusal,
// PermanentDestinationRefusal, SizeLimit (see the package doc for what
// they assert, docs/writing-a-sink.md for each).
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Name == "" || h.New == nil {
		t.Fatal("sinktest: Harness.Name and Harness.New are required")
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			if why, ok := h.KnownDefects[c.Name]; ok {
				t.Skipf("known defect: %s fails %s: %s", h.Name, c.Name, why)
			}
			c.Run(t, h)
		})
	}
}

// publishTimeout bounds one Publish call of the suite.
const publishTimeout = 60 * time.Second

// run is one case's state: its sink, its destinations and the messages
// it handed over, by id.
type run struct {
	t    *testing.T
	name string
	sink *Sink
	tag  string

	mu   sync.Mutex
	next int64
	sent map[int64]relay.Message
}

func start(t *testing.T, h Harness) *run {
	t.Helper()
	s := h.New(t)
	if s == nil || s.Sink == nil || s.Read == nil {
		t.Fatalf("sinktest: %s: Harness.New must return a Sink with Sink and Read", h.Name)
	}
	if _, err := s.Sink.Routing(""); err != nil {
		t.Fatalf("sinktest: %s: Routing(\"\") failed: %v; a sink must route without a prefix", h.Name, err)
	}
	var b [5]byte
	_, _ = rand.Read(b[:])
	return &run{t: t, name: h.Name, sink: s, tag: hex.EncodeToString(b[:]), next: 1, sent: map[int64]relay.Message{}}
}

// need skips the case when the sink lacks a capability.
func (r *run) need(has bool, field, what string) {
	r.t.Helper()
	if !has {
		r.t.Skipf("sinktest: %s declares no Sink.%s, so %s is not checked for it", r.name, field, what)
	}
}

// dest returns a destination name of this case's own.
func (r *run) dest(name string) string { return "sinktest-" + r.tag + "-" + name }

// msg builds the next message to dest, with a payload naming it unless
// payload is given.
func (r *run) msg(dest string, agg uuid.UUID, payload string, headers map[string]string) relay.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := r.next
	r.next++
	if payload == "" {
		payload = fmt.Sprintf(`{"n": %d, "aggregate": "%s"}`, id, agg)
	}
	m := relay.Message{ID: id, AggregateID: agg, Type: "sinktest.event", Topic: dest, Payload: []byte(payload),
		Headers: headers, CreatedAt: time.Now()}
	r.sent[id] = m
	return m
}

// publish hands msgs to the sink in one call and returns its errors,
// failing the case when it returns the wrong number.
func (r *run) publish(msgs []relay.Message) []error {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	errs := r.sink.Sink.Publish(ctx, slices.Clone(msgs))
	if len(errs) != len(msgs) {
		r.t.Fatalf("sinktest: %s: Publish of %d messages returned %d errors; it must return one per message, in order", r.name, len(msgs), len(errs))
	}
	for i, err := range errs {
		if err != nil && r.sink.Sink.ErrorCode(err) == "" {
			r.t.Errorf("sinktest: %s: ErrorCode is empty for message %d's error %q; name every error with a short, stable code", r.name, msgs[i].ID, err)
		}
	}
	return errs
}

// publishAll hands msgs over, then the ones not acknowledged again, in
// order, as a relayer retries them, until every one is acknowledged.
func (r *run) publishAll(msgs []relay.Message) {
	r.t.Helper()
	left := msgs
	for attempt := 1; len(left) > 0; attempt++ {
		errs := r.publish(left)
		again := unacked(left, errs)
		if len(again) > 0 && attempt == 5 {
			r.t.Fatalf("sinktest: %s: %d messages still fail after %d publishes with no fault injected; first: message %d: %v",
				r.name, len(again), attempt, again[0].ID, firstErr(errs))
		}
		left = again
	}
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// acked returns the messages of msgs whose error is nil.
func acked(msgs []relay.Message, errs []error) []relay.Message { return pick(msgs, errs, true) }

// unacked returns the messages of msgs whose error is not nil.
func unacked(msgs []relay.Message, errs []error) []relay.Message { return pick(msgs, errs, false) }

func pick(msgs []relay.Message, errs []error, ok bool) []relay.Message {
	var out []relay.Message
	for i, err := range errs {
		if (err == nil) == ok {
			out = append(out, msgs[i])
		}
	}
	return out
}

// check reads dest back and asserts that every message of want reached
// it, none of never did, nothing the case did not send to dest did, each
// delivery is byte-exact, and each aggregate's first deliveries come in
// the order the case handed its messages over (ascending ids).
func (r *run) check(dest string, want []relay.Message, never ...int64) {
	r.t.Helper()
	got := r.sink.Read(r.t, dest, len(want))
	seen := map[int64]bool{}
	last := map[string]int64{} // per key, the latest first delivery
	for _, d := range got {
		m, ok := r.sent[d.ID]
		if !ok || m.Topic != dest {
			r.t.Fatalf("sinktest: %s: destination %s holds a message with id %d, which the case never sent there: is the event id readable on every delivered message (Delivered.ID)?", r.name, dest, d.ID)
		}
		if slices.Contains(never, d.ID) {
			r.t.Errorf("sinktest: %s: message %d reached %s although the sink refused it", r.name, d.ID, dest)
		}
		r.exact(m, d)
		if seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		if prev, ok := last[d.Key]; ok && d.ID < prev {
			r.t.Errorf("sinktest: %s: aggregate %s: message %d first reached %s after message %d, which was handed over after it",
				r.name, d.Key, d.ID, dest, prev)
		}
		last[d.Key] = max(last[d.Key], d.ID)
	}
	var missing []int64
	for _, m := range want {
		if !seen[m.ID] {
			missing = append(missing, m.ID)
		}
	}
	if len(missing) > 0 {
		r.t.Errorf("sinktest: %s: %d acknowledged messages never reached %s (ids %v); read back %d", r.name, len(missing), dest, missing, len(got))
	}
}

// exact asserts that d is m as delivered, byte for byte.
func (r *run) exact(m relay.Message, d Delivered) {
	r.t.Helper()
	if d.Key != m.AggregateID.String() {
		r.t.Errorf("sinktest: %s: message %d delivered with aggregate %q, want %q", r.name, m.ID, d.Key, m.AggregateID)
	}
	if d.Type != m.Type {
		r.t.Errorf("sinktest: %s: message %d delivered with type %q, want %q", r.name, m.ID, d.Type, m.Type)
	}
	if !bytes.Equal(d.Payload, m.Payload) {
		r.t.Errorf("sinktest: %s: message %d: payload not delivered byte for byte:\n got %q\nwant %q", r.name, m.ID, d.Payload, m.Payload)
	}
	for k, v := range m.Headers {
		got, ok := d.Headers[k]
		if !ok {
			r.t.Errorf("sinktest: %s: message %d: header %q missing from the delivery", r.name, m.ID, k)
		} else if got != v {
			r.t.Errorf("sinktest: %s: message %d: header %q delivered as %q, want %q", r.name, m.ID, k, got, v)
		}
	}
}

// reasons are the codes a permanent error may carry.
var reasons = []string{relay.ReasonTooLarge, relay.ReasonInvalidTopic, relay.ReasonUndecodable,
	relay.ReasonReservedHeader, relay.ReasonNotAuthorized, relay.ReasonBrokerRefused}

// permanent asserts that err is a permanent failure with a known reason
// (want, when given).
func (r *run) permanent(m relay.Message, err error, want string) {
	r.t.Helper()
	switch {
	case err == nil:
		r.t.Errorf("sinktest: %s: message %d was acknowledged; the sink was set to refuse it", r.name, m.ID)
	case !relay.IsPermanent(err):
		r.t.Errorf("sinktest: %s: message %d: a refusal that retrying cannot fix must be permanent (relay.PermanentReason), got %v", r.name, m.ID, err)
	case want != "" && relay.ReasonOf(err) != want:
		r.t.Errorf("sinktest: %s: message %d: reason %q, want %q (%v)", r.name, m.ID, relay.ReasonOf(err), want, err)
	case !slices.Contains(reasons, relay.ReasonOf(err)):
		r.t.Errorf("sinktest: %s: message %d: reason %q is none of relay's Reason codes (%v)", r.name, m.ID, relay.ReasonOf(err), err)
	}
}

// retriable asserts that err is a failure a retry may fix.
func (r *run) retriable(m relay.Message, err error, why string) {
	r.t.Helper()
	switch {
	case err == nil:
		r.t.Errorf("sinktest: %s: message %d was acknowledged; %s", r.name, m.ID, why)
	case relay.IsPermanent(err) || relay.ReasonOf(err) != "":
		r.t.Errorf("sinktest: %s: message %d: %s, and its failure is not its own to keep: it must not be permanent, got reason %q (%v)",
			r.name, m.ID, why, relay.ReasonOf(err), err)
	}
}

// ok asserts that err is nil.
func (r *run) ok(m relay.Message, err error, why string) {
	r.t.Helper()
	if err != nil {
		r.t.Errorf("sinktest: %s: message %d failed (%v); %s", r.name, m.ID, err, why)
	}
}
