package walrelay

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock that moves only when the test moves it (Advance),
// and tells the test each time a timer is armed (waitArmed), so that a
// test drives the relayer's waits instead of sleeping through them.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	armed  chan time.Duration
}

// newFakeClock starts at the wall clock's now: deadlines the test sets
// from it are also sensible deadlines for a socket.
func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Now(), armed: make(chan time.Duration, 64)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	t.Reset(d)
	return t
}

// Advance moves the clock on by d, firing the timers due by then.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		t.fireIfDue()
	}
}

// waitArmed waits until a timer of the clock is armed (created or reset)
// for want. Armings for other waits are passed over: a read re-arms its
// wait on each deadline set, one set before it as well.
func (c *fakeClock) waitArmed(t *testing.T, want time.Duration) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	var seen []time.Duration
	for {
		select {
		case d := <-c.armed:
			if d == want {
				return
			}
			seen = append(seen, d)
		case <-timeout:
			t.Fatalf("no timer was armed for %s (armed: %v)", want, seen)
		}
	}
}

type fakeTimer struct {
	c      *fakeClock
	ch     chan time.Time
	at     time.Time
	active bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

// fireIfDue fires t if it is due; c.mu is held.
func (t *fakeTimer) fireIfDue() {
	if t.active && !t.at.After(t.c.now) {
		t.active = false
		select {
		case t.ch <- t.c.now:
		default:
		}
	}
}

// Stop and Reset drain the channel, as time.Timer's do since Go 1.23.
func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	select {
	case <-t.ch:
	default:
	}
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	was := t.active
	select {
	case <-t.ch:
	default:
	}
	t.at, t.active = t.c.now.Add(d), true
	t.fireIfDue()
	t.c.mu.Unlock()
	t.c.armed <- d
	return was
}
