package procs

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeRelay is what a controller samples: counters the test moves on.
type fakeRelay struct {
	batches, events int64
	cpu             time.Duration
}

func (f *fakeRelay) sample() (int64, int64) { return f.batches, f.events }

// tick moves the fake on by one second of relaying: batches of perBatch
// events, using cpuShare of a core.
func (f *fakeRelay) tick(batches, perBatch int64, cpuShare float64) {
	f.batches += batches
	f.events += batches * perBatch
	f.cpu += time.Duration(cpuShare * float64(time.Second))
}

func newTestController(f *fakeRelay, start time.Time) *controller {
	cfg := Config{Sample: f.sample, BatchSize: 5000, Max: 4, cpu: func() time.Duration { return f.cpu }, set: func(int) {}}
	return newController(cfg.withDefaults(), start)
}

func TestControllerStaysOnOneThreadAtATrickle(t *testing.T) {
	t.Parallel()
	f := &fakeRelay{}
	start := time.Unix(1000, 0)
	c := newTestController(f, start)
	for s := 1; s <= 60; s++ {
		f.tick(300, 3, 0.15) // 1,000 events/s in batches of 3
		n, changed := c.step(start.Add(time.Duration(s) * time.Second))
		require.False(t, changed, "second %d", s)
		require.Equal(t, 1, n)
	}
}

func TestControllerRaisesOnABacklogAndHoldsBeforeLowering(t *testing.T) {
	t.Parallel()
	f := &fakeRelay{}
	start := time.Unix(1000, 0)
	c := newTestController(f, start)
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }

	// Full batches at light CPU (the polling relay waits for Postgres):
	// raised at the first such sample, even right after the start.
	f.tick(10, 5000, 0.3)
	n, changed := c.step(at(1))
	require.True(t, changed)
	require.Equal(t, 4, n)

	// The backlog is gone: it stays raised for the hold, then lowers.
	for s := 2; s < 11; s++ {
		f.tick(300, 3, 0.15)
		n, changed = c.step(at(s))
		require.False(t, changed, "second %d", s)
		require.Equal(t, 4, n)
	}
	f.tick(300, 3, 0.15)
	n, changed = c.step(at(11))
	require.True(t, changed)
	require.Equal(t, 1, n)

	// Busy by CPU alone (small batches, more than half a core): raised,
	// but no sooner than MinGap after the last change.
	f.tick(2000, 20, 0.8)
	_, changed = c.step(at(12))
	require.False(t, changed, "within MinGap of the last change")
	for s := 13; s < 16; s++ {
		f.tick(300, 3, 0.15)
		_, changed = c.step(at(s))
		require.False(t, changed, "second %d", s)
	}
	f.tick(300, 3, 0.15)
	n, changed = c.step(at(16))
	require.True(t, changed, "the busy sample at 12s still counts within the hold")
	require.Equal(t, 4, n)
}

func TestControllerIdleRelayStaysOnOneThread(t *testing.T) {
	t.Parallel()
	f := &fakeRelay{}
	start := time.Unix(1000, 0)
	c := newTestController(f, start)
	for s := 1; s <= 20; s++ { // no batches at all
		_, changed := c.step(start.Add(time.Duration(s) * time.Second))
		require.False(t, changed)
	}
}

func TestStartSetsOneThreadAndStopRestoresMax(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		set []int
	)
	f := &fakeRelay{}
	cfg := Config{Sample: f.sample, BatchSize: 5000, Max: 3, Interval: time.Hour,
		cpu: func() time.Duration { return 0 },
		set: func(n int) { mu.Lock(); set = append(set, n); mu.Unlock() }}
	stop := Start(context.Background(), cfg)
	stop()
	require.Equal(t, []int{1, 3}, set)

	// One CPU: one thread, no controller.
	set = nil
	cfg.Max = 1
	Start(context.Background(), cfg)()
	require.Equal(t, []int{1}, set)
}
