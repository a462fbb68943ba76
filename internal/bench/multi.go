package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cputime"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/migrate"
)

// The multi scenario: one `outbox relay --config` process serving many
// outboxes in many databases of one server, one of them busy, the others
// idle: what the process holds (RSS, server connections), what it burns
// while idle, and whether the busy outbox's latency suffers from the
// others, healthy or with one database unreachable, against a relay
// serving the busy outbox alone, in the same run.

// multiRate is the busy outbox's load, events per second.
const multiRate = 200

// multiAppName is the application_name of the relays' connections, by
// which the scenario counts them on the server.
const multiAppName = "outbox_bench_multi"

// multiEnv is the scenario's databases and outboxes.
type multiEnv struct {
	s      *session
	dbs    []string // database names
	per    int      // outboxes per database
	urls   []string // per database, as the relay connects
	busy   *env     // the busy outbox, for the emitters
	dir    string   // the relay's config file lives here
	prefix string   // topic prefix of the run
}

func runMulti(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	res := &Result{}
	if cfg.OutboxCommand == nil {
		res.note("skipped: no outbox command to run (the `outbox bench` CLI provides one: it runs its own binary's `relay`)")
		return res, nil
	}
	dbs, per := pick(cfg.Short, 2, 10), pick(cfg.Short, 3, 5)
	idle, window := pick(cfg.Short, 3*time.Second, 20*time.Second), pick(cfg.Short, 2*time.Second, 20*time.Second)
	res.param("outboxes", "%d in %d databases of the server (%d tables each, created for the run and dropped after), polling, defaults (LISTEN/NOTIFY, poll interval 1s, metrics refresh 5s, watchdog 1m, cleanup 1h), publishing to the bench's dev broker", dbs*per, dbs, per)
	res.param("relays", "`outbox relay --config FILE` serving all of them, and `outbox relay` serving the busy outbox alone, each its own process with --log-level warn")
	res.param("load", "the busy outbox (first table of the first database): one event per transaction at %d events/s for %s; the other outboxes idle", multiRate, window)
	res.param("measures", "RSS (VmRSS and peak VmHWM, /proc) and server connections (pg_stat_activity, application_name %s) once the relay is idle; idle CPU: user + system time over %s of no load, as %% of one core; commit-to-ack: from the emitter's COMMIT to the dev broker receiving the produce request; \"db down\": the last database refuses connections (ALTER DATABASE ... ALLOW_CONNECTIONS false, its backends terminated)", multiAppName, idle)
	m, err := newMultiEnv(ctx, s, dbs, per)
	if err != nil {
		return nil, err
	}
	defer m.close()

	t := Table{Title: "one relay process for many outboxes", Columns: []string{"relay", "outboxes", "RSS MiB", "peak RSS MiB", "server connections", "of them LISTEN", "idle CPU % of a core", "busy p50 ms", "busy p99 ms", "busy p99 ms, a db down"}}
	s.progress("multi: the busy outbox alone")
	alone, err := m.phase(ctx, res, false, idle, window)
	if err != nil {
		return res, fmt.Errorf("alone: %w", err)
	}
	t.Rows = append(t.Rows, multiRow(res, "alone", "`outbox relay` (flags)", 1, alone))
	res.Tables = []Table{t}
	s.progress("multi: %d outboxes in one process", dbs*per)
	all, err := m.phase(ctx, res, true, idle, window)
	if err != nil {
		return res, fmt.Errorf("%d outboxes: %w", dbs*per, err)
	}
	t.Rows = append(t.Rows, multiRow(res, "multi", "`outbox relay --config`", dbs*per, all))
	res.Tables = []Table{t}
	multiTargets(res)
	res.note("the machine is shared: load1 was %.2f at the start; latency moves with it more than CPU time does", load1())
	return res, nil
}

// multiStats is one relay process's figures.
type multiStats struct {
	mem                memStatus
	conns, listens     int64
	idleCPU            float64 // % of one core
	lat, latDown       []time.Duration
	latNote, downNote  string
	events, eventsDown int64
}

func multiRow(res *Result, key, name string, outboxes int, st multiStats) []string {
	k := "multi." + key + "."
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	res.metric(k+"rss_mib", mib(st.mem.rss))
	res.metric(k+"peak_rss_mib", mib(st.mem.hwm))
	res.metric(k+"server_connections", float64(st.conns))
	res.metric(k+"idle_cpu_pct", st.idleCPU)
	p50, p99, down := "-", "-", "-"
	if st.lat != nil {
		p50, p99 = ms(percentile(st.lat, 50)), ms(percentile(st.lat, 99))
		res.metric(k+"p50_ms", float64(percentile(st.lat, 50))/float64(time.Millisecond))
		res.metric(k+"p99_ms", float64(percentile(st.lat, 99))/float64(time.Millisecond))
	} else {
		res.note("%s: latency not measured: %s", key, st.latNote)
	}
	if st.latDown != nil {
		down = ms(percentile(st.latDown, 99))
		res.metric(k+"p99_down_ms", float64(percentile(st.latDown, 99))/float64(time.Millisecond))
	} else if st.downNote != "" {
		res.note("%s: latency with a database down not measured: %s", key, st.downNote)
	}
	return []string{name, thousands(int64(outboxes)), fmt.Sprintf("%.1f", mib(st.mem.rss)), fmt.Sprintf("%.1f", mib(st.mem.hwm)),
		thousands(st.conns), thousands(st.listens), fmt.Sprintf("%.2f", st.idleCPU), p50, p99, down}
}

func multiTargets(res *Result) {
	m := res.Metrics
	if v, ok := m["multi.multi.peak_rss_mib"]; ok {
		res.target("multi: RSS of one relay for all outboxes", "< 150 MiB", fmt.Sprintf("%.1f MiB peak", v), v < 150)
	}
	if v, ok := m["multi.multi.idle_cpu_pct"]; ok {
		res.target("multi: idle CPU", "< 2% of a core", fmt.Sprintf("%.2f%%", v), v < 2)
	}
	alone, ok := m["multi.alone.p99_ms"]
	if !ok {
		return
	}
	for _, k := range []struct{ key, name string }{{"multi.multi.p99_ms", "others idle"}, {"multi.multi.p99_down_ms", "a database down"}} {
		if v, ok := m[k.key]; ok {
			res.target("multi: busy outbox p99, "+k.name, "<= 1.5x alone", fmt.Sprintf("%.2f ms vs %.2f ms alone (%.2fx)", v, alone, v/alone), v <= 1.5*alone)
		}
	}
}

// newMultiEnv creates dbs databases holding per outbox tables each.
func newMultiEnv(ctx context.Context, s *session, dbs, per int) (*multiEnv, error) {
	id := randomID()
	m := &multiEnv{s: s, per: per, prefix: "benchmulti" + id + "_"}
	var err error
	if m.dir, err = os.MkdirTemp("", "outbox-bench-multi-"); err != nil {
		return nil, err
	}
	for i := range dbs {
		name := fmt.Sprintf("bench_multi_%s_%d", id, i)
		if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+pgident.Quote(name)); err != nil {
			m.close()
			return nil, fmt.Errorf("create database %s (the role needs CREATEDB): %w", name, err)
		}
		m.dbs = append(m.dbs, name)
		m.urls = append(m.urls, databaseURL(s.cfg.DatabaseURL, name, multiAppName))
		if err := migrateTables(ctx, databaseURL(s.cfg.DatabaseURL, name, "outbox_bench"), per); err != nil {
			m.close()
			return nil, err
		}
	}
	pcfg, err := pgxpool.ParseConfig(databaseURL(s.cfg.DatabaseURL, m.dbs[0], "outbox_bench"))
	if err != nil {
		m.close()
		return nil, err
	}
	pcfg.MaxConns = int32(latencyWriters(s.cfg.Writers, multiRate) + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		m.close()
		return nil, err
	}
	m.busy = &env{s: s, id: id, schema: outbox.DefaultSchema, tables: multiTables(0), pool: pool}
	return m, nil
}

func multiTables(j int) outbox.Tables {
	return outbox.Tables{Outbox: fmt.Sprintf("outbox_%d", j)}.WithDefaults()
}

func migrateTables(ctx context.Context, url string, per int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for j := range per {
		mg, err := migrate.New(multiTables(j))
		if err != nil {
			return err
		}
		if _, err := mg.Up(ctx, conn); err != nil {
			return fmt.Errorf("migrate %s: %w", multiTables(j).OutboxIdent(), err)
		}
	}
	return nil
}

// databaseURL is base (a URL, a key=value string or "") naming database
// db, its connections named app.
func databaseURL(base, db, app string) string {
	if u, err := url.Parse(base); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + db
		q := u.Query()
		q.Set("application_name", app)
		u.RawQuery = q.Encode()
		return u.String()
	}
	// The last setting of a key wins.
	return strings.TrimSpace(base + " dbname=" + db + " application_name=" + app)
}

func (m *multiEnv) close() {
	if m.busy != nil {
		m.busy.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, db := range m.dbs {
		if _, err := m.s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgident.Quote(db)+" WITH (FORCE)"); err != nil {
			m.s.progress("drop database %s: %v (drop it by hand)", db, err)
		}
	}
	_ = os.RemoveAll(m.dir)
}

// phase runs one relay (all outboxes from a config file, or the busy one
// alone from flags) on a broker of its own and measures it.
func (m *multiEnv) phase(ctx context.Context, res *Result, all bool, idle, window time.Duration) (st multiStats, err error) {
	b, err := m.s.startBroker()
	if err != nil {
		return st, err
	}
	defer b.close()
	acks := newAckLog()
	if b.dev == nil {
		return st, errors.New("the multi scenario needs the bench's dev broker (no --brokers): it stamps produce requests to time them")
	}
	b.dev.ControlKey(int16(kmsg.Produce), acks.control)
	addr, err := freeAddr()
	if err != nil {
		return st, err
	}
	rd, err := m.startRelay(ctx, b, all, addr)
	if err != nil {
		return st, err
	}
	defer rd.kill()
	p, err := outbox.NewProducer(outbox.Config{Tables: m.busy.tables, TopicPrefix: m.prefix})
	if err != nil {
		return st, err
	}
	if err := m.awaitReady(ctx, rd, addr, func(string) bool { return true }); err != nil {
		return st, err
	}
	// Warm up: one event, through, before anything is counted.
	if err := emitBusy(ctx, m.busy, p); err != nil {
		return st, err
	}
	if err := awaitAcks(rd, acks, 1, 60*time.Second); err != nil {
		return st, fmt.Errorf("warm-up: %w", err)
	}
	if err := m.measureIdle(ctx, rd, idle, &st); err != nil {
		return st, err
	}
	if st.lat, st.latNote, st.events, err = m.busyLatency(ctx, rd, b, acks, p, window); err != nil {
		return st, err
	}
	if all {
		if err := m.databaseDown(ctx, rd, addr); err != nil {
			return st, err
		}
		if st.latDown, st.downNote, st.eventsDown, err = m.busyLatency(ctx, rd, b, acks, p, window); err != nil {
			return st, err
		}
	}
	if st.mem, err = rd.memory(); err != nil {
		return st, err
	}
	return st, rd.stop()
}

// startRelay starts the relay of all outboxes (a config file) or of the
// busy one alone (flags), serving --http on addr.
func (m *multiEnv) startRelay(ctx context.Context, b *broker, all bool, addr string) (*child, error) {
	if !all {
		return startChild(ctx, m.s.cfg, "the relay of one outbox", "relay", "--database-url", m.urls[0], "--table", m.busy.tables.Outbox,
			"--brokers", b.addrs(), "--topic-prefix", m.prefix, "--log-level", "warn", "--http", addr)
	}
	var f strings.Builder
	fmt.Fprintf(&f, "brokers: %q\ntopic-prefix: %q\nlog-level: warn\nhttp: %q\noutboxes:\n", b.addrs(), m.prefix, addr)
	for i, u := range m.urls {
		for j := range m.per {
			fmt.Fprintf(&f, "  - name: %q\n    database-url: %q\n    table: %q\n", fmt.Sprintf("db%d.outbox_%d", i, j), u, multiTables(j).Outbox)
		}
	}
	path := filepath.Join(m.dir, "relay.yaml")
	if err := os.WriteFile(path, []byte(f.String()), 0o600); err != nil {
		return nil, err
	}
	return startChild(ctx, m.s.cfg, "the relay of every outbox", "relay", "--config", path)
}

// measureIdle measures the idle relay: connections, then CPU over idle.
func (m *multiEnv) measureIdle(ctx context.Context, rd *child, idle time.Duration, st *multiStats) error {
	// Let the start's one-off work (first cleanup and watchdog runs) pass.
	if err := rd.sleep(3*time.Second, "while settling"); err != nil {
		return err
	}
	err := m.s.admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN %')
FROM pg_stat_activity WHERE application_name = $1`, multiAppName).Scan(&st.conns, &st.listens)
	if err != nil {
		return err
	}
	pid := rd.cmd.Process.Pid
	c0, err := cputime.Process(pid)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := rd.sleep(idle, "while idle"); err != nil {
		return err
	}
	c1, err := cputime.Process(pid)
	if err != nil {
		return err
	}
	st.idleCPU = 100 * float64(c1-c0) / float64(time.Since(start))
	return nil
}

// busyLatency emits into the busy outbox at multiRate for window and
// returns the commit-to-ack latencies, sorted.
func (m *multiEnv) busyLatency(ctx context.Context, rd *child, b *broker, acks *ackLog, p *outbox.Producer, window time.Duration) ([]time.Duration, string, int64, error) {
	before := acks.count()
	clock := &ackClock{acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
	em, err := emitAtRate(ctx, m.s, m.busy, p, clock, latencyRun{rate: multiRate}, window, latencyWriters(m.s.cfg.Writers, multiRate))
	if err != nil {
		return nil, "", 0, err
	}
	if err := awaitAcks(rd, acks, before+em.events, 60*time.Second); err != nil {
		return nil, "", 0, err
	}
	lat, note := acks.latencies(ctx, b, m.prefix+"order", clock)
	return lat, note, em.events, nil
}

// databaseDown makes the last database refuse connections and ends its
// sessions, and waits until the relay reports its outboxes not ready.
func (m *multiEnv) databaseDown(ctx context.Context, rd *child, addr string) error {
	down := m.dbs[len(m.dbs)-1]
	if _, err := m.s.admin.Exec(ctx, "ALTER DATABASE "+pgident.Quote(down)+" ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("make database %s unreachable: %w", down, err)
	}
	if _, err := m.s.admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", down); err != nil {
		return err
	}
	prefix := fmt.Sprintf("db%d.", len(m.dbs)-1)
	return m.awaitReady(ctx, rd, addr, func(name string) bool { return !strings.HasPrefix(name, prefix) })
}

// awaitReady waits until /outboxes shows every outbox ready or not as
// want says.
func (m *multiEnv) awaitReady(ctx context.Context, rd *child, addr string, want func(name string) bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		ok, got := outboxesReady(ctx, addr, want)
		if ok {
			return nil
		}
		if got != "" {
			last = got
		}
		if err := rd.sleep(200*time.Millisecond, "while starting"); err != nil {
			return err
		}
	}
	return fmt.Errorf("the outboxes were not ready as expected within 2 minutes: %s", last)
}

func outboxesReady(ctx context.Context, addr string, want func(name string) bool) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/outboxes", nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, ""
	}
	defer resp.Body.Close()
	var list []struct {
		Name     string `json:"name"`
		State    string `json:"state"`
		Ready    bool   `json:"ready"`
		NotReady string `json:"not_ready"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return false, err.Error()
	}
	for _, o := range list {
		if o.Ready != want(o.Name) {
			return false, fmt.Sprintf("%s is %s, ready %t (%s)", o.Name, o.State, o.Ready, o.NotReady)
		}
	}
	return true, ""
}

func emitBusy(ctx context.Context, e *env, p *outbox.Producer) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := p.Emit(ctx, tx, outbox.Event{AggregateID: [16]byte{1}, Type: "order.placed", Payload: newOrder(0)})
		return err
	})
}

// awaitAcks waits until the broker has received n records.
func awaitAcks(rd *child, acks *ackLog, n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for acks.count() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("the broker received %d of %d records within %s", acks.count(), n, timeout)
		}
		if err := rd.sleep(5*time.Millisecond, "while relaying"); err != nil {
			return err
		}
	}
	return nil
}

// freeAddr is a loopback address nothing listens on right now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
