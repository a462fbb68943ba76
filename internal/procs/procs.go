// Package procs sets how many threads run the relay's Go code at once
// (GOMAXPROCS): one while the relay follows a trickle of events, all of
// them while it works through a backlog.
//
// At a trickle the relay is a chain of hand-offs between goroutines (the
// claim or stream reader, the publisher, the broker client's writer and
// reader). With several Ps each hand-off can wake an idle thread on
// another core, a futex wake-up that on a virtual machine costs more than
// the work handed off; on one P the woken goroutine runs on the thread
// that woke it. Through a backlog the relay's own work (decoding,
// encoding records) is what bounds it, and a second core is worth having.
//
// The controller samples the relay twice a second: the events per batch
// (the source's Stats) and the process's CPU time. A sample whose batches
// average at least half the batch size, or whose CPU use reaches half a
// core, is busy: the next change raises GOMAXPROCS to its starting value.
// Only after Hold without a busy sample does it go back to one. Changing
// GOMAXPROCS stops the world, so two changes are at least MinGap apart.
//
//	stop := procs.Start(ctx, procs.Config{Sample: func() (int64, int64) { s := src.Stats(); return s.Batches, s.Claimed }, BatchSize: 5000})
//	defer stop()
package procs

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/pgoutbox/outbox/internal/cputime"
)

// Defaults of Config.
const (
	DefaultInterval = 500 * time.Millisecond
	DefaultHold     = 10 * time.Second
	DefaultMinGap   = 5 * time.Second
	// DefaultBusyCPU is the share of one core whose use over a sample
	// makes it busy: with one P the relay's Go code cannot use more than
	// a core, and well before that its goroutines wait for one another.
	DefaultBusyCPU = 0.5
)

// Config is one controller's settings.
type Config struct {
	// Sample returns the source's cumulative batches and events in them
	// (relay.Stats' Batches and Claimed). Required.
	Sample func() (batches, events int64)
	// BatchSize is the source's batch size: batches averaging half of it
	// or more over a sample mean a backlog. Required.
	BatchSize int
	// Max is GOMAXPROCS while busy. Defaults to GOMAXPROCS when Start is
	// called (the GOMAXPROCS environment variable, or the CPUs the
	// process may use).
	Max int
	// Interval between samples. Defaults to DefaultInterval (500ms).
	Interval time.Duration
	// Hold is how long without a busy sample before going back to one P.
	// Defaults to DefaultHold (10s).
	Hold time.Duration
	// MinGap is the least time between two changes. Defaults to
	// DefaultMinGap (5s).
	MinGap time.Duration
	// BusyCPU is the share of one core whose use over a sample makes it
	// busy. Defaults to DefaultBusyCPU (0.5).
	BusyCPU float64
	// Logger receives a debug line per change. Defaults to slog.Default().
	Logger *slog.Logger

	// cpu is the process's CPU time, reg the process's GOMAXPROCS;
	// tests replace them.
	cpu func() time.Duration
	reg *registry
}

// registry is the process's GOMAXPROCS, shared by every controller in it
// (several relays in one process, as tests run them): it is the most any
// of them wants, and goes back to what it was before the first started
// once the last has stopped.
type registry struct {
	mu    sync.Mutex
	set   func(int) // runtime.GOMAXPROCS
	get   func() int
	orig  int // before the first controller started
	cur   int
	wants map[*int]int
}

var process = &registry{set: func(n int) { runtime.GOMAXPROCS(n) }, get: func() int { return runtime.GOMAXPROCS(0) }}

// join registers a controller, which wants one P, and returns its key and
// the GOMAXPROCS the process had before any controller ran.
func (g *registry) join() (*int, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.wants) == 0 {
		g.orig, g.cur = g.get(), g.get()
		g.wants = map[*int]int{}
	}
	k := new(int)
	g.wants[k] = 1
	g.apply()
	return k, g.orig
}

func (g *registry) want(k *int, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.wants[k] = n
	g.apply()
}

func (g *registry) leave(k *int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.wants, k)
	g.apply()
}

// apply sets GOMAXPROCS to the most any controller wants, or back to the
// original when none is left. g.mu is held.
func (g *registry) apply() {
	n := g.orig
	if len(g.wants) > 0 {
		n = 0
		for _, w := range g.wants {
			n = max(n, w)
		}
	}
	if n != g.cur {
		g.set(n)
		g.cur = n
	}
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.Hold <= 0 {
		c.Hold = DefaultHold
	}
	if c.MinGap <= 0 {
		c.MinGap = DefaultMinGap
	}
	if c.BusyCPU <= 0 {
		c.BusyCPU = DefaultBusyCPU
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.cpu == nil {
		c.cpu = cputime.Self
	}
	if c.reg == nil {
		c.reg = process
	}
	return c
}

// Start runs the controller until stop is called: it sets GOMAXPROCS to
// 1 at once and changes it as the samples say; stop waits for it to end
// and, once no other controller of the process runs, sets GOMAXPROCS back
// to what it was. With Max 1 (one CPU, or GOMAXPROCS=1) there is nothing
// to adapt: it stays on one P until stop.
func Start(ctx context.Context, cfg Config) (stop func()) {
	cfg = cfg.withDefaults()
	key, orig := cfg.reg.join()
	if cfg.Max <= 0 {
		cfg.Max = orig
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if cfg.Max > 1 {
		wg.Go(func() { run(ctx, cfg, func(n int) { cfg.reg.want(key, n) }) })
	}
	return func() {
		cancel()
		wg.Wait()
		cfg.reg.leave(key)
	}
}

func run(ctx context.Context, cfg Config, set func(int)) {
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	c := newController(cfg, time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n, changed := c.step(now); changed {
				set(n)
				cfg.Logger.Debug("relay threads changed", "gomaxprocs", n, "events_per_batch", c.lastPerBatch, "cpu_share", c.lastCPU)
			}
		}
	}
}

// controller decides GOMAXPROCS from the samples; it holds no lock and
// changes nothing itself (step says what to set).
type controller struct {
	cfg          Config
	procs        int
	changed      time.Time // when procs last changed
	lastBusy     time.Time // when the last busy sample was taken
	at           time.Time // when the previous sample was taken
	batches      int64
	events       int64
	cpu          time.Duration
	lastPerBatch float64 // the last sample's, for the log
	lastCPU      float64
}

func newController(cfg Config, now time.Time) *controller {
	// changed starts zero: a backlog there at the start raises at the
	// first busy sample.
	c := &controller{cfg: cfg, procs: 1, at: now, cpu: cfg.cpu()}
	c.batches, c.events = cfg.Sample()
	return c
}

// step takes a sample at now and returns the GOMAXPROCS it wants and
// whether that is a change.
func (c *controller) step(now time.Time) (int, bool) {
	batches, events := c.cfg.Sample()
	cpu := c.cfg.cpu()
	elapsed := now.Sub(c.at)
	db, de, dc := batches-c.batches, events-c.events, cpu-c.cpu
	c.at, c.batches, c.events, c.cpu = now, batches, events, cpu
	c.lastPerBatch, c.lastCPU = 0, 0
	if db > 0 {
		c.lastPerBatch = float64(de) / float64(db)
	}
	if elapsed > 0 {
		c.lastCPU = float64(dc) / float64(elapsed)
	}
	if c.lastPerBatch*2 >= float64(c.cfg.BatchSize) || c.lastCPU >= c.cfg.BusyCPU {
		c.lastBusy = now
	}
	want := 1
	if !c.lastBusy.IsZero() && now.Sub(c.lastBusy) < c.cfg.Hold {
		want = c.cfg.Max
	}
	if want == c.procs || now.Sub(c.changed) < c.cfg.MinGap {
		return c.procs, false
	}
	c.procs, c.changed = want, now
	return want, true
}
