package sinktest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/sinktest"
)

// memSink is the smallest complete sink: it keeps each destination's
// messages in memory, and can be made to show every fault the suite
// injects. A real sink's Publish talks to its server instead, and its
// harness injects the faults there (see relay/kafkapub's sinktest_test.go,
// and testdata/filesink for a sink in a module of its own).
type memSink struct {
	maxBytes int
	broken   string // a defect to plant (TestSuiteFailsBrokenSinks); "" for none

	mu        sync.Mutex
	dests     map[string][]relay.Message
	failing   map[string]bool // destinations failing for now
	refused   map[string]bool // destinations refusing for good
	failIDs   map[int64]bool
	refuseIDs map[int64]bool
}

var errUnavailable = errors.New("memsink: destination unavailable for now")

func (s *memSink) Publish(_ context.Context, msgs []relay.Message) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(msgs))
	failed := map[uuid.UUID]bool{}
	for i, m := range msgs {
		if failed[m.AggregateID] && s.broken != "overtake" {
			errs[i] = errors.New("memsink: not sent: an earlier message of its aggregate failed")
			continue
		}
		switch {
		case len(m.Payload) > s.maxBytes:
			errs[i] = relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf("memsink: payload of %d bytes; the limit is %d", len(m.Payload), s.maxBytes))
		case s.refused[m.Topic]:
			errs[i] = relay.PermanentReason(relay.ReasonNotAuthorized, fmt.Errorf("memsink: %s refuses writes", m.Topic))
		case s.refuseIDs[m.ID]:
			errs[i] = relay.Permanent(fmt.Errorf("memsink: message %d refused", m.ID))
			if s.broken == "blame" {
				for j := range errs {
					errs[j] = errs[i]
				}
				return errs
			}
		case s.failing[m.Topic] || s.failIDs[m.ID]:
			errs[i] = errUnavailable
			if s.broken == "classify" {
				errs[i] = relay.Permanent(errUnavailable)
			}
		case s.broken == "lose" && m.ID%5 == 0:
			continue // acknowledged, never stored
		default:
			if s.broken == "rewrite" {
				var b bytes.Buffer
				_ = json.Compact(&b, m.Payload)
				m.Payload = b.Bytes()
			}
			s.dests[m.Topic] = append(s.dests[m.Topic], m)
			continue
		}
		failed[m.AggregateID] = true
	}
	return errs
}

// Routing routes as Kafka does (the type up to its first '.', after the
// prefix); a sink with other naming rules writes its own outbox.Routing.
func (s *memSink) Routing(prefix string) (outbox.Routing, error) {
	r := outbox.KafkaRouting{TopicPrefix: prefix, MaxRecordBytes: outbox.DefaultMaxRecordBytes}
	return r, r.Validate()
}

// ErrorCode names Publish's errors for metrics.
func (s *memSink) ErrorCode(err error) string {
	switch {
	case errors.Is(err, errUnavailable):
		return "unavailable"
	case relay.IsPermanent(err):
		return relay.ReasonOf(err)
	}
	return "not_sent"
}

func (s *memSink) read(dest string) []sinktest.Delivered {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sinktest.Delivered
	for _, m := range s.dests[dest] {
		out = append(out, sinktest.Delivered{ID: m.ID, Key: m.AggregateID.String(), Type: m.Type, Payload: m.Payload, Headers: m.Headers})
	}
	return out
}

// set flips one fault on (and returns how to turn it off).
func set[K comparable](s *memSink, m map[K]bool, k K) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	m[k] = true
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(m, k)
	}
}

// A sink runs the suite from its own tests: New gives each case a fresh
// sink, Read what reached a destination, and each fault field a
// capability (leave one nil and its cases skip, saying so).
func TestMemorySink(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "memory", New: func(t *testing.T) *sinktest.Sink {
		s := &memSink{maxBytes: 64 << 10, broken: os.Getenv(breakEnv), dests: map[string][]relay.Message{},
			failing: map[string]bool{}, refused: map[string]bool{}, failIDs: map[int64]bool{}, refuseIDs: map[int64]bool{}}
		return &sinktest.Sink{
			Sink:              s,
			Read:              func(_ *testing.T, dest string, _ int) []sinktest.Delivered { return s.read(dest) },
			MaxBytes:          s.maxBytes,
			FailDestination:   func(_ *testing.T, dest string) func() { return set(s, s.failing, dest) },
			RefuseDestination: func(_ *testing.T, dest string) { set(s, s.refused, dest) },
			FailMessage:       func(_ *testing.T, _ string, id int64) func() { return set(s, s.failIDs, id) },
			RefuseMessage:     func(_ *testing.T, _ string, id int64) { set(s, s.refuseIDs, id) },
		}
	}})
}

// breakEnv plants a defect in TestMemorySink's sink.
const breakEnv = "SINKTEST_BREAK"

// The suite fails a sink with any of the defects it is there to find:
// TestMemorySink, run again with each defect planted, fails with the
// suite's word for it.
func TestSuiteFailsBrokenSinks(t *testing.T) {
	t.Parallel()
	if os.Getenv(breakEnv) != "" {
		t.Skip("running with a planted defect")
	}
	for defect, want := range map[string]string{
		"overtake": "it comes after message",
		"blame":    "a failure belongs to the message that caused it",
		"classify": "it must not be permanent",
		"rewrite":  "payload not delivered byte for byte",
		"lose":     "acknowledged messages never reached",
	} {
		t.Run(defect, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestMemorySink$", "-test.count=1")
			cmd.Env = append(os.Environ(), breakEnv+"="+defect)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("TestMemorySink passed with defect %q planted:\n%s", defect, out)
			}
			if !strings.Contains(string(out), want) {
				t.Fatalf("TestMemorySink with defect %q failed without saying %q:\n%s", defect, want, out)
			}
			if !slices.Contains(strings.Fields(string(out)), "FAIL") {
				t.Fatalf("TestMemorySink with defect %q did not report FAIL:\n%s", defect, out)
			}
		})
	}
}
