package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func runMemory(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	res := &Result{}
	n := int64(cfg.MemoryEvents)
	res.param("load", "%s pending events over %s aggregates, committed in one statement while the relay idles", thousands(n), thousands(int64(cfg.Aggregates)))
	res.param("relay", "`outbox relay` as its own process (defaults: batch 1,000, LISTEN/NOTIFY), publishing to the bench's broker")
	res.param("measure", "VmHWM (peak resident set) and VmRSS from /proc/PID/status, before the load and once it is drained")
	if cfg.RelayCommand == nil {
		res.note("skipped: no relay command to run (the `outbox bench` CLI provides one: it runs its own binary's `relay`)")
		return res, nil
	}
	e, err := s.newEnv(ctx, "memory", 2)
	if err != nil {
		return nil, err
	}
	defer e.close()
	b, err := s.startBroker()
	if err != nil {
		return nil, err
	}
	defer b.close()

	prefix := fmt.Sprintf("bench%s_", e.id)
	args := []string{"--schema", e.schema, "--brokers", b.addrs(), "--topic-prefix", prefix, "--log-level", "warn"}
	if cfg.DatabaseURL != "" {
		args = append(args, "--database-url", cfg.DatabaseURL)
	}
	cmd := cfg.RelayCommand(ctx, args...)
	cmd.Stdout, cmd.Stderr = cfg.Progress, cfg.Progress
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the relay: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	pid := cmd.Process.Pid

	// Idle first: connected, listening, nothing to do.
	select {
	case err := <-exited:
		stopped = true
		return nil, fmt.Errorf("the relay exited at start: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	idle, err := procStatus(pid)
	if err != nil {
		return nil, err
	}

	s.progress("memory: preloading %d events", n)
	t0 := time.Now()
	if err := e.preload(ctx, int(n), cfg.Aggregates); err != nil {
		return nil, err
	}
	// A bulk INSERT sends no NOTIFY; wake the relay as Emit would.
	if err := e.exec(ctx, "SELECT pg_notify($1, '')", e.tables.Channel()); err != nil {
		return nil, err
	}
	start := time.Now()
	preloadTime := start.Sub(t0)
	s.progress("memory: relay draining %d events", n)
	deadline := start.Add(drainTimeout(n))
	for {
		var left bool
		if err := e.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+e.tables.OutboxIdent()+" WHERE dispatched_at IS NULL)").Scan(&left); err != nil {
			return nil, err
		}
		if !left {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the relay did not drain %d events within %s", n, drainTimeout(n))
		}
		select {
		case err := <-exited:
			stopped = true
			return nil, fmt.Errorf("the relay exited while draining: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	final, err := procStatus(pid)
	if err != nil {
		return nil, err
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return nil, err
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			return nil, fmt.Errorf("the relay exited with %v after SIGTERM; want a clean exit", err)
		}
	case <-time.After(45 * time.Second):
		return nil, errors.New("the relay did not exit within 45s of SIGTERM")
	}
	published, err := b.published(ctx, prefix+"order")
	if err != nil {
		return nil, err
	}
	if published < n {
		return nil, fmt.Errorf("the broker holds %d of %d events", published, n)
	}

	res.Tables = append(res.Tables, Table{Title: "relay process memory", Columns: []string{"phase", "VmRSS", "VmHWM (peak)", "events/s"}, Rows: [][]string{
		{"idle (connected, listening)", mib(idle.rss), mib(idle.hwm), "-"},
		{fmt.Sprintf("after draining %s events", thousands(n)), mib(final.rss), mib(final.hwm), rate(perSecond(n, elapsed))},
	}})
	res.metric("memory.idle_rss_bytes", float64(idle.rss))
	res.metric("memory.peak_rss_bytes", float64(final.hwm))
	res.metric("memory.events", float64(n))
	res.metric("memory.published", float64(published))
	res.metric("memory.events_per_s", perSecond(n, elapsed))
	res.target(fmt.Sprintf("relay peak RSS draining %s", thousands(n)), "< 64 MiB", mib(final.hwm), final.hwm < 64<<20)
	res.note("preload took %.1fs; drain time is measured from the wake-up, polling every 100 ms", preloadTime.Seconds())
	return res, nil
}

type memStatus struct{ rss, hwm int64 }

// procStatus reads a process's resident set (VmRSS) and its peak (VmHWM).
func procStatus(pid int) (memStatus, error) {
	var st memStatus
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, fmt.Errorf("read the relay's memory: %w (the memory scenario needs Linux /proc)", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			st.rss = kb << 10
		case "VmHWM":
			st.hwm = kb << 10
		}
	}
	return st, sc.Err()
}
