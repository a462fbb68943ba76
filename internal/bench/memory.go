package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func runMemory(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	res := &Result{}
	n := int64(cfg.MemoryEvents)
	res.param("load", "%s pending events over %s aggregates, committed in one statement while the relay idles", thousands(n), thousands(int64(cfg.Aggregates)))
	res.param("relay", "`outbox relay` as its own process (defaults: batch 5,000, LISTEN/NOTIFY), publishing to the bench's broker")
	res.param("consumer", "`outbox consume --output none` as its own process (defaults: batch 100, concurrency 1), started once the relay has drained, reading the relayed topic from the start under a new name; its idle figures come from a second one on an empty topic")
	res.param("measure", "VmHWM (peak resident set) and VmRSS from /proc/PID/status, idle and once every event is relayed, then processed")
	if cfg.OutboxCommand == nil {
		res.note("skipped: no outbox command to run (the `outbox bench` CLI provides one: it runs its own binary's `relay` and `consume`)")
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
	start := func(name string, args ...string) (*child, error) {
		args = append(args, "--schema", e.schema, "--brokers", b.addrs(), "--log-level", "warn")
		if cfg.DatabaseURL != "" {
			args = append(args, "--database-url", cfg.DatabaseURL)
		}
		return startChild(ctx, cfg, name, args...)
	}

	rm, err := measureRelay(ctx, s, e, start, prefix, n)
	if err != nil {
		return nil, err
	}
	topic := prefix + "order"
	published, err := b.published(ctx, topic)
	if err != nil {
		return nil, err
	}
	if published < n {
		return nil, fmt.Errorf("the broker holds %d of %d events", published, n)
	}

	cm, err := measureConsumer(ctx, s, e, b, start, topic, "bench-memory-"+e.id, n)
	if err != nil {
		return nil, err
	}
	memoryReport(res, n, published, rm, cm)

	wm, skipped, err := runMemoryWAL(ctx, s, n)
	if err != nil {
		return res, fmt.Errorf("wal relay: %w", err)
	}
	walMemoryReport(res, n, wm, skipped)
	return res, nil
}

type relayMemory struct {
	idle, final memStatus
	preload     time.Duration // the bulk INSERT, before the relay is woken
	elapsed     time.Duration // from the wake-up to the drained table
}

// measureRelay runs `outbox relay` idle, then preloads n events, wakes it
// and waits until it has dispatched them all; it stops the relay.
func measureRelay(ctx context.Context, s *session, e *env, start func(name string, args ...string) (*child, error), prefix string, n int64) (relayMemory, error) {
	var m relayMemory
	relay, err := start("the relay", "relay", "--topic-prefix", prefix)
	if err != nil {
		return m, err
	}
	defer relay.kill()
	// Idle first: connected, listening, nothing to do.
	if err := relay.sleep(1500*time.Millisecond, "at start"); err != nil {
		return m, err
	}
	if m.idle, err = relay.memory(); err != nil {
		return m, err
	}

	s.progress("memory: preloading %d events", n)
	t0 := time.Now()
	if err := e.preload(ctx, int(n), s.cfg.Aggregates); err != nil {
		return m, err
	}
	// A bulk INSERT sends no NOTIFY; wake the relay as Emit would.
	if err := e.exec(ctx, "SELECT pg_notify($1, '')", e.tables.Channel()); err != nil {
		return m, err
	}
	wake := time.Now()
	m.preload = wake.Sub(t0)
	s.progress("memory: relay draining %d events", n)
	if err := awaitDrained(ctx, e, relay, n, wake); err != nil {
		return m, err
	}
	m.elapsed = time.Since(wake)
	if m.final, err = relay.memory(); err != nil {
		return m, err
	}
	if err := relay.stop(); err != nil {
		return m, err
	}
	return m, nil
}

// awaitDrained polls every 100 ms until the outbox has no pending row,
// failing when relay exits or the drain takes longer than drainTimeout
// from wake.
func awaitDrained(ctx context.Context, e *env, relay *child, n int64, wake time.Time) error {
	deadline := wake.Add(drainTimeout(n))
	for {
		var left bool
		if err := e.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+e.tables.OutboxIdent()+" WHERE dispatched_at IS NULL)").Scan(&left); err != nil {
			return err
		}
		if !left {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the relay did not drain %d events within %s", n, drainTimeout(n))
		}
		if err := relay.sleep(100*time.Millisecond, "while draining"); err != nil {
			return err
		}
	}
}

// memoryReport writes the memory scenario's table, metrics and targets.
func memoryReport(res *Result, n, published int64, rm relayMemory, cm consumerMemory) {
	res.Tables = append(res.Tables, Table{Title: "relay and consumer process memory", Columns: []string{"process, phase", "VmRSS", "VmHWM (peak)", "events/s"}, Rows: [][]string{
		{"relay idle (connected, listening)", mib(rm.idle.rss), mib(rm.idle.hwm), "-"},
		{fmt.Sprintf("relay after draining %s events", thousands(n)), mib(rm.final.rss), mib(rm.final.hwm), rate(perSecond(n, rm.elapsed))},
		{"consumer idle (connected, in its group)", mib(cm.idle.rss), mib(cm.idle.hwm), "-"},
		{fmt.Sprintf("consumer after processing %s events", thousands(n)), mib(cm.final.rss), mib(cm.final.hwm), rate(perSecond(n, cm.elapsed))},
	}})
	res.metric("memory.idle_rss_bytes", float64(rm.idle.rss))
	res.metric("memory.peak_rss_bytes", float64(rm.final.hwm))
	res.metric("memory.events", float64(n))
	res.metric("memory.published", float64(published))
	res.metric("memory.events_per_s", perSecond(n, rm.elapsed))
	res.metric("memory.consumer.idle_rss_bytes", float64(cm.idle.rss))
	res.metric("memory.consumer.rss_bytes", float64(cm.final.rss))
	res.metric("memory.consumer.peak_rss_bytes", float64(cm.final.hwm))
	res.metric("memory.consumer.processed", float64(cm.processed))
	res.metric("memory.consumer.events_per_s", perSecond(n, cm.elapsed))
	res.target(fmt.Sprintf("relay peak RSS draining %s", thousands(n)), "< 64 MiB", mib(rm.final.hwm), rm.final.hwm < 64<<20)
	res.target("consumer RSS under load", "< 64 MiB", fmt.Sprintf("%s (VmHWM processing %s events)", mib(cm.final.hwm), thousands(n)), cm.final.hwm < 64<<20)
	res.note("preload took %.1fs; drain time is measured from the wake-up, polling every 100 ms", rm.preload.Seconds())
	res.note("the consumer's time runs from its start (group join included) until its group's committed offsets reach the end of the topic, polled every 100 ms; the processed rows under its name are then counted")
}

type consumerMemory struct {
	idle, final memStatus
	processed   int64
	elapsed     time.Duration
}

// measureConsumer runs `outbox consume --output none` idle on an empty
// topic, then on topic until it has processed all n events under name.
// Progress is read from the group's committed offsets, which the consumer
// moves only past records whose transaction committed: counting a million
// processed rows takes about 100 ms, so counting every 100 ms would take a
// good part of a core from the process being measured. The processed rows
// are counted once, at the end.
func measureConsumer(ctx context.Context, s *session, e *env, b *broker, start func(name string, args ...string) (*child, error),
	topic, name string, n int64) (consumerMemory, error) {
	var m consumerMemory
	count := func() (int64, error) {
		var got int64
		err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.tables.ProcessedIdent()+" WHERE consumer = $1", name).Scan(&got)
		return got, err
	}
	opts, err := b.cfg.Options()
	if err != nil {
		return m, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return m, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	if m.idle, err = measureIdleConsumer(ctx, adm, start, topic, name); err != nil {
		return m, err
	}

	s.progress("memory: consumer processing %d events", n)
	t0 := time.Now()
	c, err := start("the consumer", "consume", "--output", "none", "--topics", topic, "--name", name)
	if err != nil {
		return m, err
	}
	defer c.kill()
	if err := awaitCaughtUp(ctx, adm, c, count, name, topic, n, t0); err != nil {
		return m, err
	}
	m.elapsed = time.Since(t0)
	if m.final, err = c.memory(); err != nil {
		return m, err
	}
	if err := c.stop(); err != nil {
		return m, err
	}
	if m.processed, err = count(); err != nil {
		return m, err
	}
	if m.processed != n {
		return m, fmt.Errorf("the consumer read every record of %s, but the processed table holds %d rows for %s; want %d (were records dead-lettered? see its log)",
			topic, m.processed, name, n)
	}
	return m, nil
}

// measureIdleConsumer runs the same command on a topic that exists (so it
// is assigned its partitions) and stays empty, and reads its memory.
func measureIdleConsumer(ctx context.Context, adm *kadm.Client, start func(name string, args ...string) (*child, error), topic, name string) (memStatus, error) {
	idleTopic := topic + "_idle"
	if _, err := adm.CreateTopic(ctx, -1, -1, nil, idleTopic); err != nil {
		return memStatus{}, fmt.Errorf("create the idle consumer's topic %s: %w", idleTopic, err)
	}
	idle, err := start("the idle consumer", "consume", "--output", "none", "--topics", idleTopic, "--name", name+"-idle")
	if err != nil {
		return memStatus{}, err
	}
	defer idle.kill()
	if err := idle.sleep(1500*time.Millisecond, "at start"); err != nil {
		return memStatus{}, err
	}
	st, err := idle.memory()
	if err != nil {
		return st, err
	}
	if err := idle.stop(); err != nil {
		return st, err
	}
	return st, nil
}

// awaitCaughtUp polls every 100 ms until group name has committed the end
// of topic, failing when c exits or it takes longer than drainTimeout from
// t0; count says how far it got.
func awaitCaughtUp(ctx context.Context, adm *kadm.Client, c *child, count func() (int64, error), name, topic string, n int64, t0 time.Time) error {
	deadline := t0.Add(drainTimeout(n))
	var lastErr error
	for {
		done, err := caughtUp(ctx, adm, name, topic)
		if err == nil && done {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		if time.Now().After(deadline) {
			got, cerr := count()
			if cerr != nil {
				return cerr
			}
			msg := fmt.Sprintf("the consumer processed %d of %d events within %s", got, n, drainTimeout(n))
			if lastErr != nil {
				msg += fmt.Sprintf(" (reading its group's offsets last failed with: %v)", lastErr)
			}
			return errors.New(msg)
		}
		if err := c.sleep(100*time.Millisecond, "while processing"); err != nil {
			return err
		}
	}
}

// caughtUp reports whether group has committed offsets at the end of every
// non-empty partition of topic.
func caughtUp(ctx context.Context, adm *kadm.Client, group, topic string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return false, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return false, fmt.Errorf("fetch the offsets of group %s: %w", group, err)
	}
	done := true
	ends.Each(func(o kadm.ListedOffset) {
		if c, ok := committed.Lookup(o.Topic, o.Partition); o.Offset > 0 && (!ok || c.Err != nil || c.At < o.Offset) {
			done = false
		}
	})
	return done, nil
}

// child is an outbox CLI process the scenario measures.
type child struct {
	name    string
	cmd     *exec.Cmd
	exited  chan error
	done    bool
	started time.Time
}

func startChild(ctx context.Context, cfg Config, name string, args ...string) (*child, error) {
	cmd := cfg.OutboxCommand(ctx, args...)
	cmd.Stdout, cmd.Stderr = cfg.Progress, cfg.Progress
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, exited: make(chan error, 1), started: time.Now()}
	go func() { c.exited <- cmd.Wait() }()
	return c, nil
}

// sleep waits d, and fails if the process exits meanwhile; when says
// what it was doing.
func (c *child) sleep(d time.Duration, when string) error {
	select {
	case err := <-c.exited:
		c.done = true
		return fmt.Errorf("%s exited %s: %v", c.name, when, err)
	case <-time.After(d):
		return nil
	}
}

func (c *child) memory() (memStatus, error) {
	st, err := procStatus(c.cmd.Process.Pid)
	if err != nil {
		return st, fmt.Errorf("read the memory of %s: %w", c.name, err)
	}
	return st, nil
}

// stop sends SIGTERM and waits for a clean exit.
func (c *child) stop() error {
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s: %w", c.name, err)
	}
	select {
	case err := <-c.exited:
		c.done = true
		if err != nil {
			return fmt.Errorf("%s exited with %v after SIGTERM; want a clean exit", c.name, err)
		}
		return nil
	case <-time.After(45 * time.Second):
		return fmt.Errorf("%s did not exit within 45s of SIGTERM", c.name)
	}
}

// kill ends the process when the scenario failed before stopping it.
func (c *child) kill() {
	if !c.done {
		_ = c.cmd.Process.Kill()
		<-c.exited
		c.done = true
	}
}

type memStatus struct{ rss, hwm int64 }

// procStatus reads a process's resident set (VmRSS) and its peak (VmHWM).
func procStatus(pid int) (memStatus, error) {
	var st memStatus
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, fmt.Errorf("%w (the memory scenario needs Linux /proc)", err)
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
