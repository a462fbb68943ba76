package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cputime"
)

// The steady scenario: what relaying costs per event when events trickle
// in, one per transaction, at a fixed rate, rather than in a backlog. Each
// small batch then pays the relay's whole cycle (wake-up, claim or
// stream read, publish, commit or status update), so CPU per event is the
// figure that matters, against pg_recvlogical reading the same slot.

// steadyRole is the role the readers connect as on the scenario's
// server, so that their backends (walsenders included) and their
// statements in pg_stat_statements are told apart from the emitters'.
const steadyRole = "outbox_bench_relay"

// steadySource is one reader of the load.
type steadySource struct{ key, name string }

func steadySources() []steadySource {
	// pg_recvlogical first: the relays' rows compare with it.
	return []steadySource{
		{"recvlogical", "pg_recvlogical on the same kind of slot, to /dev/null"},
		{"floor", "floor: the cheapest WAL relay (bench only, not a mode: produce what one read took in, wait for its ack; 2 ms linger, one thread)"},
		{"poll", "`outbox relay` (polling, defaults)"},
		{"wal", "`outbox relay --mode wal` (defaults)"},
	}
}

// steadyStats is one reader at one rate.
type steadyStats struct {
	events   int64
	achieved float64
	// cpu is the reader process's user + system time from the first
	// event of the window until it has taken in the last; serverCPU its
	// backends' (the steady role's), 0 when not measured.
	cpu, serverCPU time.Duration
	// calls and execMs are the steady role's statements in
	// pg_stat_statements over the same span; -1 when not measured.
	calls, execMs float64
	// requests is how many produce requests carried the window's events
	// (relays): events per request is the relay's batch size.
	requests int64
	lat      []time.Duration // sorted commit-to-ack; nil when not measured
	latNote  string
}

// steadyEnv is what every run of the scenario shares.
type steadyEnv struct {
	s         *session // on the scenario's server
	e         *env
	readerURL string // the steady role's URL, or the server's
	roleOK    bool   // readers connect as steadyRole
	pgss      bool   // pg_stat_statements is there to read
	recv      string // pg_recvlogical's path, "" when not found
	window    time.Duration
}

func runSteady(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	res := &Result{}
	if cfg.OutboxCommand == nil {
		res.note("skipped: no outbox command to run (the `outbox bench` CLI provides one: it runs its own binary's `relay`)")
		return res, nil
	}
	dbURL, server, stop, err := s.logicalServerWith(ctx, "steady", map[string]string{"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"})
	if err != nil {
		return nil, err
	}
	defer stop()
	ws, err := s.on(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer ws.admin.Close()
	rates := cfg.SteadyRates
	e, err := ws.newEnv(ctx, "steady", int32(latencyWriters(cfg.Writers, slices.Max(rates))+4))
	if err != nil {
		return nil, err
	}
	defer e.close()
	se := &steadyEnv{s: ws, e: e, readerURL: dbURL, window: pick(cfg.Short, time.Second, 8*time.Second)}
	se.prepare(ctx, res, dbURL)
	steadyParams(ctx, se, res, server, rates)

	t := Table{Title: "steady load: one event per transaction at a fixed rate", Columns: []string{"rate", "reader", "achieved ev/s", "events", "reader CPU µs/event", "vs pg_recvlogical", "events/request", "server CPU µs/event", "statements/event", "stmt exec µs/event", "p50 ms", "p99 ms", "load1"}}
	for _, rt := range rates {
		got := map[string]steadyStats{}
		for _, src := range steadySources() {
			if !slices.Contains(cfg.SteadySources, src.key) || src.key == "recvlogical" && se.recv == "" {
				continue
			}
			s.progress("steady: %s events/s, %s", thousands(int64(rt)), src.key)
			load := load1()
			st, err := se.run(ctx, src.key, rt)
			if err != nil {
				return res, fmt.Errorf("%d events/s, %s: %w", rt, src.key, err)
			}
			got[src.key] = st
			res.Tables = nil // rebuilt below, once per row, so a failure still reports the rows before it
			t.Rows = append(t.Rows, steadyRow(res, rt, src, st, got["recvlogical"], load))
			res.Tables = []Table{t}
		}
	}
	steadyTargets(res)
	res.note("CPU is each process's time on a CPU (user + system) from /proc/PID/task/*/schedstat, in nanoseconds, over the span from the window's start until the reader has taken in its last event; the dev broker and the emitters run in the bench process and are not counted")
	res.note("the rows run one after the other, under whatever else loads the machine (load1 column); CPU per event moves less with load than wall time does")
	return res, nil
}

// prepare creates the readers' role and pg_stat_statements on the
// scenario's server and finds pg_recvlogical, noting what it could not do.
func (se *steadyEnv) prepare(ctx context.Context, res *Result, dbURL string) {
	if err := se.e.exec(ctx, `DO $$ BEGIN CREATE ROLE `+steadyRole+` LOGIN SUPERUSER; EXCEPTION WHEN duplicate_object THEN NULL; END $$`); err != nil {
		res.note("server CPU and statements not measured: creating role %s failed (%v)", steadyRole, err)
	} else if u, err := url.Parse(dbURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.User = url.User(steadyRole)
		se.readerURL, se.roleOK = u.String(), true
	} else {
		res.note("server CPU and statements not measured: the database URL is not a postgres:// URL to connect to as %s", steadyRole)
	}
	if err := se.e.exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		res.note("statements not measured: pg_stat_statements is not available (%v); it needs shared_preload_libraries=pg_stat_statements, which the throwaway cluster sets", err)
	} else if err := se.e.exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		res.note("statements not measured: pg_stat_statements is not loaded (%v); it needs shared_preload_libraries=pg_stat_statements, which the throwaway cluster sets", err)
	} else {
		se.pgss = se.roleOK
	}
	if p, err := findRecvlogical(); err == nil {
		se.recv = p
	} else {
		res.note("pg_recvlogical not run: %v", err)
	}
}

func steadyParams(ctx context.Context, se *steadyEnv, res *Result, server string, rates []int) {
	cfg := se.s.cfg
	var version string
	_ = se.e.pool.QueryRow(ctx, "SHOW server_version").Scan(&version)
	res.param("server", "%s, Postgres %s, wal_level=logical, fsync=%s, synchronous_commit=%s, shared_preload_libraries=pg_stat_statements", server, version, setting(ctx, se.e, "fsync"), setting(ctx, se.e, "synchronous_commit"))
	var rs []string
	for _, r := range rates {
		rs = append(rs, thousands(int64(r))+"/s")
	}
	res.param("load", "one event per transaction (BEGIN; Emit; COMMIT) paced at %v for %s by max(%d, rate/200) writers in the bench process, over %s aggregates; one warm-up event first (topic creation, first claim), not counted", rs, se.window, cfg.Writers, thousands(int64(cfg.Aggregates)))
	res.param("readers", "each its own process, one at a time, connecting as role %s: `outbox relay` and `outbox relay --mode wal` (this binary, defaults, --log-level warn) publishing to the bench's in-process dev broker; the floor (`outbox bench floor-reader`, this binary): the same slot read with pgconn's replication protocol, the inserts of the transactions one read took in produced with franz-go (the relay's producer options; reads 2 ms apart at most, as the relay's default --linger) and their ack awaited before reading on, on one thread, nothing else (no order under failure, holds, metrics, retries): the least a relay that waits for the broker costs on this machine; pg_recvlogical %s", steadyRole, strings.Join(recvlogicalArgs("<slot>", "<publication>", ""), " "))
	if cfg.SteadyRelayBinary != "" {
		res.param("relay binary", "%s (--steady-relay-binary)", cfg.SteadyRelayBinary)
	}
	if len(cfg.SteadyRelayArgs) > 0 {
		res.param("relay flags", "%s (--steady-relay-arg)", strings.Join(cfg.SteadyRelayArgs, " "))
	}
	res.param("latency", "commit-to-ack: from the emitter's COMMIT returning to the dev broker receiving the produce request that carries the event (a kfake control function stamps each request; offsets then map records to requests)")
	res.param("server cost", "server CPU: user + system time of the role's backends (walsender included), from /proc; statements: pg_stat_statements of the role (calls and total_exec_time), reset at the window's start")
}

// steadyRow records one reader's figures and returns its table row.
func steadyRow(res *Result, rt int, src steadySource, st, recv steadyStats, load float64) []string {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(max(st.events, 1)) }
	key := fmt.Sprintf("steady.%d.%s.", rt, src.key)
	cpu := per(st.cpu)
	res.metric(key+"events", float64(st.events))
	res.metric(key+"achieved_per_s", st.achieved)
	res.metric(key+"cpu_us_per_event", cpu)
	res.metric(key+"load1", load)
	vs := "-"
	if src.key != "recvlogical" && recv.events > 0 && recv.cpu > 0 {
		r := cpu / (float64(recv.cpu.Microseconds()) / float64(recv.events))
		res.metric(key+"vs_recvlogical", r)
		vs = fmt.Sprintf("%.1fx", r)
	}
	perReq := "-"
	if st.requests > 0 {
		perReq = fmt.Sprintf("%.1f", float64(st.events)/float64(st.requests))
		res.metric(key+"events_per_request", float64(st.events)/float64(st.requests))
	}
	server, calls, exec := "-", "-", "-"
	if st.serverCPU > 0 {
		server = fmt.Sprintf("%.0f", per(st.serverCPU))
		res.metric(key+"server_cpu_us_per_event", per(st.serverCPU))
	}
	if st.calls >= 0 {
		calls = fmt.Sprintf("%.2f", st.calls/float64(max(st.events, 1)))
		exec = fmt.Sprintf("%.0f", st.execMs*1000/float64(max(st.events, 1)))
		res.metric(key+"statements_per_event", st.calls/float64(max(st.events, 1)))
		res.metric(key+"stmt_exec_us_per_event", st.execMs*1000/float64(max(st.events, 1)))
	}
	p50, p99 := "-", "-"
	if st.lat != nil {
		p50, p99 = ms(percentile(st.lat, 50)), ms(percentile(st.lat, 99))
		res.metric(key+"p50_ms", float64(percentile(st.lat, 50))/float64(time.Millisecond))
		res.metric(key+"p99_ms", float64(percentile(st.lat, 99))/float64(time.Millisecond))
	} else if st.latNote != "" {
		res.note("%s at %d/s: latency not measured: %s", src.key, rt, st.latNote)
	}
	return []string{thousands(int64(rt)) + "/s", src.name, rate(st.achieved), thousands(st.events), fmt.Sprintf("%.0f", cpu), vs, perReq, server, calls, exec, p50, p99, fmt.Sprintf("%.2f", load)}
}

func steadyTargets(res *Result) {
	m := res.Metrics
	for _, src := range []string{"poll", "wal"} {
		k := "steady.1000." + src + "."
		if _, ok := m[k+"p50_ms"]; ok {
			p50, p99 := m[k+"p50_ms"], m[k+"p99_ms"]
			res.target("steady "+src+" latency @1,000/s", "p50 <= 3 ms, p99 <= 10 ms", fmt.Sprintf("p50 %.2f ms, p99 %.2f ms", p50, p99), p50 <= 3 && p99 <= 10)
		}
	}
	if r, ok := m["steady.1000.wal.vs_recvlogical"]; ok {
		floor := ""
		if f, ok := m["steady.1000.floor.vs_recvlogical"]; ok {
			floor = fmt.Sprintf("; the floor reader %.1fx", f)
		}
		res.target("steady WAL source CPU @1,000/s", "<= 1.5x pg_recvlogical, same run", fmt.Sprintf("%.1fx (%.0f vs %.0f µs/event%s)", r, m["steady.1000.wal.cpu_us_per_event"], m["steady.1000.recvlogical.cpu_us_per_event"], floor), r <= 1.5)
	}
	if c, ok := m["steady.1000.poll.cpu_us_per_event"]; ok {
		res.target("steady polling relay CPU @1,000/s", "<= 100 µs/event", fmt.Sprintf("%.0f µs/event", c), c <= 100)
	}
	for _, src := range []string{"poll", "wal"} {
		if c, ok := m["steady.10000."+src+".cpu_us_per_event"]; ok {
			res.target("steady "+src+" CPU @10,000/s", "<= 20 µs/event", fmt.Sprintf("%.0f µs/event (achieved %s ev/s)", c, rate(m["steady.10000."+src+".achieved_per_s"])), c <= 20)
		}
	}
}

// run measures one reader (poll, wal, recvlogical) at rate events/s.
func (se *steadyEnv) run(ctx context.Context, source string, rt int) (st steadyStats, err error) {
	e := se.e
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()); err != nil {
		return st, err
	}
	prefix := fmt.Sprintf("bench%s_%s_", e.id, randomID())
	slot := ""
	if source != "poll" {
		if slot, err = e.setupSlot(ctx); err != nil {
			return st, err
		}
		defer func() { err = errors.Join(err, e.teardownSlot(context.WithoutCancel(ctx), slot)) }()
	}
	b, err := se.s.startBroker()
	if err != nil {
		return st, err
	}
	defer b.close()
	acks := newAckLog()
	if b.dev != nil {
		b.dev.ControlKey(int16(kmsg.Produce), acks.control)
	}
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables, TopicPrefix: prefix, DisableNotify: source != "poll"})
	if err != nil {
		return st, err
	}
	rd, err := se.startReader(ctx, source, rt, b, prefix, slot)
	if err != nil {
		return st, err
	}
	defer rd.kill()

	// Warm up: one event, taken in, before anything is counted.
	if _, err := se.emitOne(ctx, p); err != nil {
		return st, err
	}
	if err := rd.await(ctx, se, acks, 1, 30*time.Second); err != nil {
		return st, fmt.Errorf("warm-up: %w", err)
	}
	return se.measure(ctx, rd, p, acks, b, prefix+"order", rt)
}

// measure runs the window on a warmed-up reader and collects its figures.
func (se *steadyEnv) measure(ctx context.Context, rd *steadyReader, p *outbox.Producer, acks *ackLog, b *broker, topic string, rt int) (steadyStats, error) {
	var st steadyStats
	e := se.e
	if se.pgss {
		if err := e.exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
			return st, err
		}
	}
	backends0 := se.backendCPU(ctx)
	req0 := acks.requests()
	cpu0, err := rd.cpu()
	if err != nil {
		return st, err
	}
	clock := &ackClock{acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
	writers := latencyWriters(se.s.cfg.Writers, rt)
	em, err := emitAtRate(ctx, se.s, e, p, clock, latencyRun{rate: rt}, se.window, writers)
	if err != nil {
		return st, err
	}
	if err := rd.await(ctx, se, acks, 1+em.events, 60*time.Second); err != nil {
		return st, err
	}
	cpu1, err := rd.cpu()
	if err != nil {
		return st, err
	}
	backends1 := se.backendCPU(ctx)
	st.requests = acks.requests() - req0
	st.events, st.achieved, st.cpu = em.events, perSecond(em.events, em.elapsed), cpu1-cpu0
	st.calls, st.execMs = -1, -1
	if se.roleOK {
		for pid, c := range backends1 {
			st.serverCPU += c - backends0[pid]
		}
	}
	if se.pgss {
		err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::float8, coalesce(sum(total_exec_time), 0)::float8 FROM pg_stat_statements
WHERE userid = (SELECT oid FROM pg_roles WHERE rolname = $1)`, steadyRole).Scan(&st.calls, &st.execMs)
		if err != nil {
			return st, fmt.Errorf("read pg_stat_statements: %w", err)
		}
	}
	if err := rd.stop(); err != nil {
		return st, err
	}
	if rd.source != "recvlogical" {
		st.lat, st.latNote = acks.latencies(ctx, b, topic, clock)
	}
	return st, nil
}

// emitOne commits one event and returns its id.
func (se *steadyEnv) emitOne(ctx context.Context, p *outbox.Producer) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, se.e.pool, func(tx pgx.Tx) error {
		var err error
		id, err = p.Emit(ctx, tx, outbox.Event{AggregateID: [16]byte{1}, Type: "order.placed", Payload: newOrder(0)})
		return err
	})
	return id, err
}

// backendCPU is the CPU time of each backend of the steady role, by pid;
// nil when the readers do not connect as that role.
func (se *steadyEnv) backendCPU(ctx context.Context) map[int]time.Duration {
	if !se.roleOK {
		return nil
	}
	rows, err := se.e.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE usename = $1", steadyRole)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil
	}
	out := map[int]time.Duration{}
	for _, pid := range pids {
		if c, err := cputime.Running(int(pid)); err == nil {
			out[int(pid)] = c
		}
	}
	return out
}

// steadyReader is a running reader process.
type steadyReader struct {
	source string
	slot   string
	relay  *child       // poll, wal
	recv   *recvlogical // recvlogical
}

func (se *steadyEnv) startReader(ctx context.Context, source string, rt int, b *broker, prefix, slot string) (*steadyReader, error) {
	rd := &steadyReader{source: source, slot: slot}
	if source == "recvlogical" {
		r, err := startRecvlogical(ctx, se.recv, se.readerURL, slot, slot, "")
		if err != nil {
			return nil, err
		}
		rd.recv = r
		return rd, nil
	}
	if source == "floor" {
		// This binary's, whatever --steady-relay-binary says: it is the
		// yardstick both builds are held to.
		c, err := startChild(ctx, se.s.cfg, "the floor reader", "bench", "floor-reader", "--brokers", b.addrs(), "--topic-prefix", prefix,
			"--log-level", "warn", "--database-url", se.readerURL, "--slot", slot, "--publication", slot)
		if err != nil {
			return nil, err
		}
		rd.relay = c
		return rd, nil
	}
	args := []string{"relay", "--schema", se.e.schema, "--brokers", b.addrs(), "--topic-prefix", prefix, "--log-level", "warn", "--database-url", se.readerURL}
	if source == "wal" {
		args = append(args, "--mode", "wal", "--slot", slot, "--publication", slot)
	}
	args = append(args, se.s.cfg.SteadyRelayArgs...)
	if dir := se.s.cfg.RelayProfileDir; dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("relay profile directory: %w", err)
		}
		args = append(args, "--cpuprofile", filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", source, rt)))
	}
	cfg := se.s.cfg
	if bin := cfg.SteadyRelayBinary; bin != "" {
		cfg.OutboxCommand = func(ctx context.Context, args ...string) *exec.Cmd { return exec.CommandContext(ctx, bin, args...) }
	}
	c, err := startChild(ctx, cfg, "the "+source+" relay", args...)
	if err != nil {
		return nil, err
	}
	rd.relay = c
	return rd, nil
}

func (rd *steadyReader) pid() int {
	if rd.recv != nil {
		return rd.recv.cmd.Process.Pid
	}
	return rd.relay.cmd.Process.Pid
}

func (rd *steadyReader) cpu() (time.Duration, error) {
	c, err := cputime.Running(rd.pid())
	if err != nil {
		return 0, fmt.Errorf("read the CPU time of the %s reader: %w", rd.source, err)
	}
	return c, nil
}

// await waits until the reader has taken in n events: the broker received
// n records (relays), or the slot's walsender sent the WAL up to now
// (pg_recvlogical).
func (rd *steadyReader) await(ctx context.Context, se *steadyEnv, acks *ackLog, n int64, timeout time.Duration) error {
	var target string
	if rd.recv != nil {
		if err := se.e.pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		if rd.recv != nil {
			if err := rd.recv.running(); err != nil {
				return err
			}
			var done bool
			err := se.e.pool.QueryRow(ctx, `SELECT coalesce((SELECT r.sent_lsn >= $2::pg_lsn FROM pg_stat_replication r
JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1), false)`, rd.slot, target).Scan(&done)
			if err != nil {
				return err
			}
			if done {
				return nil
			}
		} else if acks.count() >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s reader took in %d of %d events within %s", rd.source, acks.count(), n, timeout)
		}
		d := 5 * time.Millisecond
		if rd.relay != nil {
			if err := rd.relay.sleep(d, "while reading"); err != nil {
				return err
			}
		} else {
			time.Sleep(d)
		}
	}
}

func (rd *steadyReader) stop() error {
	if rd.recv != nil {
		return rd.recv.stop()
	}
	return rd.relay.stop()
}

func (rd *steadyReader) kill() {
	if rd.recv != nil {
		rd.recv.kill()
		return
	}
	rd.relay.kill()
}

// ackLog stamps each produce request the dev broker receives, per
// partition, in the order the broker handles them (control functions run
// on its single loop, before the request): a record's offset then says
// which request carried it.
type ackLog struct {
	mu    sync.Mutex
	parts map[int32][]ackedRequest
	n     int64
	reqs  int64
}

type ackedRequest struct {
	end int64 // offset after the request's records
	at  time.Time
}

func newAckLog() *ackLog { return &ackLog{parts: map[int32][]ackedRequest{}} }

func (a *ackLog) control(req kmsg.Request) (kmsg.Response, error, bool) {
	now := time.Now()
	pr, ok := req.(*kmsg.ProduceRequest)
	if !ok {
		return nil, nil, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reqs++
	for _, t := range pr.Topics {
		for _, p := range t.Partitions {
			n := int64(0)
			for rec := p.Records; len(rec) > 0; {
				var b kmsg.RecordBatch
				if err := b.ReadFrom(rec); err != nil || int(b.Length)+12 > len(rec) {
					break
				}
				n += int64(b.NumRecords)
				rec = rec[int(b.Length)+12:]
			}
			reqs := a.parts[p.Partition]
			end := n
			if len(reqs) > 0 {
				end += reqs[len(reqs)-1].end
			}
			a.parts[p.Partition] = append(reqs, ackedRequest{end: end, at: now})
			a.n += n
		}
	}
	return nil, nil, false
}

// requests is how many produce requests carried records.
func (a *ackLog) requests() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reqs
}

func (a *ackLog) count() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// at is when the request carrying offset off of partition p arrived.
func (a *ackLog) at(p int32, off int64) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	reqs := a.parts[p]
	i, _ := slices.BinarySearchFunc(reqs, off, func(r ackedRequest, off int64) int {
		if r.end <= off {
			return -1
		}
		return 1
	})
	if i >= len(reqs) {
		return time.Time{}, false
	}
	return reqs[i].at, true
}

// latencies reads topic back and pairs each event's commit (clock) with
// the arrival of its produce request; nil and why when it cannot.
func (a *ackLog) latencies(ctx context.Context, b *broker, topic string, clock *ackClock) ([]time.Duration, string) {
	if b.dev == nil {
		return nil, "the broker is not the bench's dev broker"
	}
	published, err := b.published(ctx, topic)
	if err != nil {
		return nil, err.Error()
	}
	if published != a.count() {
		return nil, fmt.Sprintf("the broker holds %d records, its produce requests carried %d (a request was refused or re-sent)", published, a.count())
	}
	opts, err := b.cfg.Options()
	if err != nil {
		return nil, err.Error()
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		return nil, err.Error()
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	acked := map[int64]time.Time{}
	for read := int64(0); read < published; {
		f := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return nil, fmt.Sprintf("read %d of %d records back: %v", read, published, err)
		}
		f.EachRecord(func(r *kgo.Record) {
			read++
			for _, h := range r.Headers {
				if h.Key == outbox.HeaderEventID {
					id, _ := strconv.ParseInt(string(h.Value), 10, 64)
					if at, ok := a.at(r.Partition, r.Offset); ok {
						if _, dup := acked[id]; !dup {
							acked[id] = at
						}
					}
				}
			}
		})
	}
	out := make([]time.Duration, 0, len(clock.commited))
	for id, c := range clock.commited {
		at, ok := acked[id]
		if !ok {
			return nil, fmt.Sprintf("event %d committed but not on the broker", id)
		}
		out = append(out, max(0, at.Sub(c)))
	}
	slices.Sort(out)
	return out, ""
}
