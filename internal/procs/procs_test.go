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
	cfg := Config{Sample: f.sample, BatchSize: 5000, Max: 4, cpu: func() time.Duration { return f.cpu }}
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

// testRegistry records what it sets; the process has 4 Ps to begin with.
func testRegistry() (*registry, func() []int) {
	var (
		mu  sync.Mutex
		got []int
	)
	g := &registry{get: func() int { return 4 }, set: func(n int) { mu.Lock(); got = append(got, n); mu.Unlock() }}
	return g, func() []int { mu.Lock(); defer mu.Unlock(); return append([]int(nil), got...) }
}

func TestStartSetsOneThreadAndTheLastStopRestoresIt(t *testing.T) {
	t.Parallel()
	g, set := testRegistry()
	f := &fakeRelay{}
	cfg := Config{Sample: f.sample, BatchSize: 5000, Interval: time.Hour, cpu: func() time.Duration { return 0 }, reg: g}
	stop := Start(context.Background(), cfg)
	require.Equal(t, []int{1}, set())
	stop()
	require.Equal(t, []int{1, 4}, set())

	// Two relays in one process: the first stop leaves one P to the
	// other, the second restores the process's own.
	g, set = testRegistry()
	cfg.reg = g
	stopA := Start(context.Background(), cfg)
	stopB := Start(context.Background(), cfg)
	stopA()
	require.Equal(t, []int{1}, set())
	stopB()
	require.Equal(t, []int{1, 4}, set())
}

// With several controllers the process runs on the most any wants.
func TestRegistryTakesTheMostAnyControllerWants(t *testing.T) {
	t.Parallel()
	g, set := testRegistry()
	a, orig := g.join()
	require.Equal(t, 4, orig)
	b, _ := g.join()
	g.want(a, 4)
	g.want(b, 1)
	require.Equal(t, []int{1, 4}, set())
	g.leave(a)
	require.Equal(t, []int{1, 4, 1}, set())
	g.leave(b)
	require.Equal(t, []int{1, 4, 1, 4}, set())
}
