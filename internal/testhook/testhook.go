// Package testhook records what a source reports to its hooks, for tests
// that wait for it and check it.
package testhook

import (
	"slices"
	"sync"

	"github.com/pgoutbox/outbox/relay"
)

// Lanes records the lane events a relayer reports (relay.LaneHook); it
// is safe for concurrent use.
type Lanes struct {
	mu     sync.Mutex
	events []relay.LaneEvent
}

// OnLane records ev.
func (l *Lanes) OnLane(ev relay.LaneEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
}

// Of returns the events of kind recorded so far, in order.
func (l *Lanes) Of(kind relay.LaneEventKind) []relay.LaneEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(l.events), func(ev relay.LaneEvent) bool { return ev.Kind != kind })
}
