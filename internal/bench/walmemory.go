package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tmppg"
)

// slotPassedSQL reports whether slot $1 has confirmed a position past $2
// (bytes), and how far it is behind the WAL (catalog view, no index).
const slotPassedSQL = `SELECT coalesce(confirmed_flush_lsn > '0/0'::pg_lsn + $2::numeric, false),
  coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, 0)
FROM pg_replication_slots WHERE slot_name = $1`

// walMemory is what the memory scenario measured of an `outbox relay
// --mode wal` process.
type walMemory struct {
	idle, final   memStatus
	sampledPeak   int64 // the largest VmRSS sampled every 50 ms while streaming
	backlog, live int64
	liveRate      float64         // achieved
	elapsed       time.Duration   // from the relay's start until the slot passed the last live commit
	catchUp       time.Duration   // from the last live commit until the slot passed it
	lagAtStop     int64           // slot lag in bytes when live production stopped
	steady        int64           // events of the steady bursts
	lags          []time.Duration // after each burst: last commit until the slot passed it
	published     int64
}

// Live production after the backlog, and the steady load the slot lag is
// measured after.
const (
	walLiveRate   = 20_000 // events/s, in transactions of 100
	walSteadyRate = 1_000  // events/s, one per transaction
)

// runMemoryWAL measures an `outbox relay --mode wal` process streaming n
// events: half a backlog committed in one INSERT before it starts, half
// produced while it streams; then how soon after a steady load stops the
// slot's confirmed position passes the last commit. It needs a server
// with wal_level=logical: when none is configured and no throwaway one
// starts, it says why in skipped rather than failing the scenario.
func runMemoryWAL(ctx context.Context, s *session, n int64) (m walMemory, skipped string, err error) {
	if s.cfg.WALDatabaseURL == "" && !tmppg.Available() {
		return m, "no server with wal_level=logical: set --wal-database-url, or put initdb and pg_ctl on the PATH for a throwaway one", nil
	}
	url, _, stopServer, err := s.logicalServer(ctx, "memory")
	if err != nil {
		return m, "", err
	}
	defer stopServer()
	ws, err := s.on(ctx, url)
	if err != nil {
		return m, "", err
	}
	defer ws.admin.Close()
	e, err := ws.newEnv(ctx, "memwal", 4)
	if err != nil {
		return m, "", err
	}
	defer e.close()
	b, err := s.startBroker()
	if err != nil {
		return m, "", err
	}
	defer b.close()
	slot, err := e.setupSlot(ctx)
	if err != nil {
		return m, "", err
	}
	defer func() { err = errors.Join(err, e.teardownSlot(context.WithoutCancel(ctx), slot)) }()

	prefix := fmt.Sprintf("bench%s_", e.id)
	start := func() (*child, error) {
		return startChild(ctx, s.cfg, "the WAL relay", "relay", "--mode", "wal", "--topic-prefix", prefix,
			"--schema", e.schema, "--brokers", b.addrs(), "--log-level", "warn", "--database-url", url)
	}
	// Idle: leading, streaming an empty slot.
	relay, err := start()
	if err != nil {
		return m, "", err
	}
	if err := awaitStreaming(ctx, e, slot, relay); err != nil {
		relay.kill()
		return m, "", err
	}
	if err := relay.sleep(pick(s.cfg.Short, 500*time.Millisecond, 1500*time.Millisecond), "at start"); err != nil {
		return m, "", err
	}
	if m.idle, err = relay.memory(); err != nil {
		relay.kill()
		return m, "", err
	}
	if err := relay.stop(); err != nil {
		return m, "", err
	}

	m.backlog = n / 2
	m.live = n - m.backlog
	s.progress("memory: preloading %d events into the slot (one INSERT)", m.backlog)
	if err := e.preload(ctx, int(m.backlog), s.cfg.Aggregates); err != nil {
		return m, "", err
	}
	s.progress("memory: WAL relay streaming the backlog and %d live events", m.live)
	t0 := time.Now()
	if relay, err = start(); err != nil {
		return m, "", err
	}
	defer relay.kill()
	sampler := sampleRSS(relay)
	defer sampler.stop()

	liveStart := time.Now()
	last, err := produceLive(ctx, e, m.backlog+1, n, s.cfg.Aggregates)
	if err != nil {
		return m, "", err
	}
	stopped := time.Now()
	m.liveRate = perSecond(m.live, stopped.Sub(liveStart))
	if _, m.lagAtStop, err = slotPassed(ctx, e, slot, last); err != nil {
		return m, "", err
	}
	if err := awaitSlotPassed(ctx, e, slot, relay, last, drainTimeout(n)); err != nil {
		return m, "", err
	}
	m.catchUp = time.Since(stopped)
	m.elapsed = time.Since(t0)

	// The lag after a load the relay keeps up with, a few times over: when
	// the slot is confirmed depends on where the last commit falls between
	// the relayer's status updates.
	bursts, window := pick(s.cfg.Short, 1, 3), pick(s.cfg.Short, 300*time.Millisecond, time.Second)
	for range bursts {
		s.progress("memory: %d events/s for %s, then the slot's lag", walSteadyRate, window)
		events, last, err := produceSteady(ctx, e, window)
		if err != nil {
			return m, "", err
		}
		stopped := time.Now()
		if err := awaitSlotPassed(ctx, e, slot, relay, last, 30*time.Second); err != nil {
			return m, "", err
		}
		m.lags = append(m.lags, time.Since(stopped))
		m.steady += events
	}

	m.sampledPeak = sampler.stop()
	if m.final, err = relay.memory(); err != nil {
		return m, "", err
	}
	if err := relay.stop(); err != nil {
		return m, "", err
	}
	if m.published, err = b.published(ctx, prefix+"order"); err != nil {
		return m, "", err
	}
	if want := n + m.steady; m.published < want {
		return m, "", fmt.Errorf("the broker holds %d of the %d events the WAL relay streamed", m.published, want)
	}
	return m, "", nil
}

// awaitStreaming waits until a process streams from slot.
func awaitStreaming(ctx context.Context, e *env, slot string, c *child) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		sent, err := e.intQuery(ctx, sentLSNSQL, slot)
		if err != nil {
			return err
		}
		if sent >= 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not stream slot %s within 20s", c.name, slot)
		}
		if err := c.sleep(20*time.Millisecond, "before streaming"); err != nil {
			return err
		}
	}
}

// produceLive commits the events numbered from to to in transactions of
// 100, paced at walLiveRate, and returns a WAL position the last commit is
// past (read inside it, before COMMIT).
func produceLive(ctx context.Context, e *env, from, to int64, aggregates int) (last int64, err error) {
	sql := fmt.Sprintf(preloadRangeSQL, e.tables.OutboxIdent())
	period := time.Second * 100 / walLiveRate
	start := time.Now()
	for i, lo := int64(0), from; lo <= to; i, lo = i+1, lo+100 {
		if d := time.Until(start.Add(time.Duration(i) * period)); d > 0 {
			time.Sleep(d)
		}
		hi := min(lo+99, to)
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sql, lo, hi, aggregates); err != nil {
				return err
			}
			if hi == to {
				return tx.QueryRow(ctx, walInsertLSNSQL).Scan(&last)
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("live events %d to %d: %w", lo, hi, err)
		}
	}
	return last, nil
}

// produceSteady emits walSteadyRate events a second, one per transaction
// (ModeInsert, lock and NOTIFY off, as for the WAL source), for window,
// and returns how many and a WAL position the last commit is past.
func produceSteady(ctx context.Context, e *env, window time.Duration) (events, last int64, err error) {
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables, DisableAggregateLock: true, DisableNotify: true})
	if err != nil {
		return 0, 0, err
	}
	total := int64(window.Seconds() * walSteadyRate)
	period := time.Second / walSteadyRate
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * period)); d > 0 {
			time.Sleep(d)
		}
		o := newOrder(int(i))
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if _, err := p.Emit(ctx, tx, outbox.Event{AggregateID: o.OrderID, Type: "order.placed", Payload: o}); err != nil {
				return err
			}
			if i == total-1 {
				return tx.QueryRow(ctx, walInsertLSNSQL).Scan(&last)
			}
			return nil
		})
		if err != nil {
			return 0, 0, err
		}
	}
	return total, last, nil
}

func slotPassed(ctx context.Context, e *env, slot string, lsn int64) (passed bool, lagBytes int64, err error) {
	err = e.pool.QueryRow(ctx, slotPassedSQL, slot, lsn).Scan(&passed, &lagBytes)
	return passed, lagBytes, err
}

// awaitSlotPassed polls every 5 ms until slot has confirmed a position
// past lsn: the relay confirms a commit only once the broker acknowledged
// every event up to it.
func awaitSlotPassed(ctx context.Context, e *env, slot string, c *child, lsn int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		passed, lag, err := slotPassed(ctx, e, slot, lsn)
		if err != nil {
			return err
		}
		if passed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s did not pass %s within %s (%s behind the WAL)", slot, lsnString(lsn), timeout, mib(lag))
		}
		if err := c.sleep(5*time.Millisecond, "while streaming"); err != nil {
			return err
		}
	}
}

func joinSeconds(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, strconv.FormatFloat(d.Seconds(), 'f', 2, 64))
	}
	return strings.Join(parts, ", ") + " s"
}

// rssSampler reads a process's VmRSS every 50 ms and keeps the largest.
type rssSampler struct {
	once sync.Once
	done chan struct{}
	peak chan int64
}

func sampleRSS(c *child) *rssSampler {
	r := &rssSampler{done: make(chan struct{}), peak: make(chan int64, 1)}
	go func() {
		var peak int64
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if st, err := procStatus(c.cmd.Process.Pid); err == nil {
				peak = max(peak, st.rss)
			}
			select {
			case <-r.done:
				r.peak <- peak
				return
			case <-t.C:
			}
		}
	}()
	return r
}

// stop ends the sampling and returns the peak; later calls return 0.
func (r *rssSampler) stop() int64 {
	var peak int64
	r.once.Do(func() {
		close(r.done)
		peak = <-r.peak
	})
	return peak
}

// walMemoryReport adds the WAL relay's rows, metrics and targets.
func walMemoryReport(res *Result, n int64, m walMemory, skipped string) {
	peakName := fmt.Sprintf("WAL relay peak RSS streaming %s (backlog + live)", thousands(n))
	lagName := "slot lag back to ~0 after a steady load stops"
	catchName := fmt.Sprintf("slot lag back to ~0 after the %s stream's last commit", thousands(n))
	if skipped != "" {
		res.note("the WAL relay was not measured: %s", skipped)
		for _, name := range []string{peakName, lagName, catchName} {
			res.target(name, "< 64 MiB, < 1 s", "not measured: "+skipped, false)
		}
		return
	}
	res.param("wal relay", "`outbox relay --mode wal` as its own process (defaults: batch 5,000, status update every 1s) on a wal_level=logical server: idle while leading an empty slot; then %s events committed in one INSERT into the slot before it starts, and %s more in transactions of 100 paced at %s/s while it streams; then bursts of %s events/s, one per transaction, the lag measured after each; VmRSS sampled every 50 ms, VmHWM at the end; the lag is the time from the last commit's return until the slot's confirmed_flush_lsn passes a position read inside that transaction (polled every 5 ms)",
		thousands(m.backlog), thousands(m.live), thousands(walLiveRate), thousands(walSteadyRate))
	res.Tables = append(res.Tables, Table{Title: "WAL relay process memory and slot lag", Columns: []string{"phase", "VmRSS", "VmHWM (peak)", "largest VmRSS sampled", "events/s", "slot lag after the last commit"}, Rows: [][]string{
		{"WAL relay idle (leading, empty slot)", mib(m.idle.rss), mib(m.idle.hwm), "-", "-", "-"},
		{fmt.Sprintf("WAL relay after %s backlog + %s live (live at %s/s; slot %s behind when it stopped)", thousands(m.backlog), thousands(m.live), rate(m.liveRate), mib(m.lagAtStop)),
			"-", "-", mib(m.sampledPeak), rate(perSecond(n, m.elapsed)), fmt.Sprintf("%.2f s", m.catchUp.Seconds())},
		{fmt.Sprintf("then %d bursts of %s events at %s/s, one per transaction", len(m.lags), thousands(m.steady/int64(max(len(m.lags), 1))), thousands(walSteadyRate)), mib(m.final.rss), mib(m.final.hwm), "-", "-", joinSeconds(m.lags)},
	}})
	res.metric("memory.wal.idle_rss_bytes", float64(m.idle.rss))
	res.metric("memory.wal.peak_rss_bytes", float64(max(m.final.hwm, m.sampledPeak)))
	res.metric("memory.wal.sampled_peak_rss_bytes", float64(m.sampledPeak))
	res.metric("memory.wal.events", float64(n))
	res.metric("memory.wal.published", float64(m.published))
	res.metric("memory.wal.events_per_s", perSecond(n, m.elapsed))
	res.metric("memory.wal.live_events_per_s", m.liveRate)
	res.metric("memory.wal.lag_bytes_at_stop", float64(m.lagAtStop))
	res.metric("memory.wal.catch_up_s", m.catchUp.Seconds())
	lag := slices.Max(m.lags)
	res.metric("memory.wal.lag_s", lag.Seconds())
	// VmHWM follows the resident set's counters lazily: a sample can
	// exceed it by a little.
	peak := max(m.final.hwm, m.sampledPeak)
	res.target(peakName, "< 64 MiB", fmt.Sprintf("%s (VmHWM %s, largest sample %s; idle %s)", mib(peak), mib(m.final.hwm), mib(m.sampledPeak), mib(m.idle.rss)), peak < 64<<20)
	res.target(lagName, "< 1 s", fmt.Sprintf("%.2f s, the longest of %d stops of a %s events/s load (%s)", lag.Seconds(), len(m.lags), thousands(walSteadyRate), joinSeconds(m.lags)), lag < time.Second)
	res.target(catchName, "< 1 s", fmt.Sprintf("%.2f s (%s behind when production stopped)", m.catchUp.Seconds(), mib(m.lagAtStop)), m.catchUp < time.Second)
}
