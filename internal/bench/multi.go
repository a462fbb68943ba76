package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// The application_names of the relays' connections, by which the
// scenario counts them on the server.
const (
	multiAppName = "outbox_bench_multi"
	aloneAppName = "outbox_bench_multi_alone"
)

// aloneTable is the lone relay's busy outbox, in the first database.
var aloneTable = outbox.Tables{Outbox: "outbox_alone"}.WithDefaults()

// multiEnv is the scenario's databases and outboxes.
type multiEnv struct {
	s      *session
	id     string
	dbs    []string      // database names
	per    int           // outboxes per database
	pool   *pgxpool.Pool // the emitters', on the first database
	dir    string        // the relay's config file lives here
	prefix string        // topic prefix of the run
}

func runMulti(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	res := &Result{}
	if cfg.OutboxCommand == nil {
		res.note("skipped: no outbox command to run (the `outbox bench` CLI provides one: it runs its own binary's `relay`)")
		return res, nil
	}
	if len(cfg.Kafka.Brokers) > 0 {
		res.note("skipped: the multi scenario needs the bench's dev broker (no --brokers): it stamps produce requests to time them")
		return res, nil
	}
	dbs, per := pick(cfg.Short, 2, 10), pick(cfg.Short, 3, 5)
	idle, window := pick(cfg.Short, 3*time.Second, 20*time.Second), pick(cfg.Short, 2*time.Second, 20*time.Second)
	res.param("outboxes", "%d in %d databases of the server (%d tables each, created for the run and dropped after), polling, defaults (LISTEN/NOTIFY, poll interval 1s, metrics refresh 5s, watchdog 1m, cleanup 1h), publishing to a dev broker of its own", dbs*per, dbs, per)
	res.param("relays", "`outbox relay --config FILE` serving all of them, and `outbox relay` (flags) serving one more outbox of the first database alone, each its own process with --log-level warn, both running at once: the busy outboxes are measured in the same windows, under the same load of the machine")
	res.param("load", "each relay's busy outbox (the first table of the first database, and the lone relay's): one event per transaction at %d events/s for %s, both at once, twice: with every database up, then with the last database unreachable (ALTER DATABASE ... ALLOW_CONNECTIONS false, its backends terminated); the other outboxes idle", multiRate, window)
	res.param("measures", "idle CPU: user + system time over %s of no load, as %% of one core; server connections (pg_stat_activity, by application_name) %s after the start, idle; RSS (VmRSS and peak VmHWM, /proc) at the end; commit-to-ack: from the emitter's COMMIT to the dev broker receiving the produce request", idle, pick(cfg.Short, 0, multiSettled))
	m, err := newMultiEnv(ctx, s, dbs, per)
	if err != nil {
		return nil, err
	}
	defer m.close()
	alone, all, err := m.startBoth(ctx)
	defer func() {
		for _, r := range []*relayRun{alone, all} {
			if r != nil {
				r.close()
			}
		}
	}()
	if err != nil {
		return nil, err
	}
	if err := m.measure(ctx, []*relayRun{alone, all}, idle, window); err != nil {
		return nil, err
	}
	t := Table{Title: "one relay process for many outboxes", Columns: []string{"relay", "outboxes", "RSS MiB", "peak RSS MiB", "server connections", "of them LISTEN", "idle CPU % of a core", "busy p50 ms", "busy p99 ms", "busy p99 ms, a db down"}}
	t.Rows = append(t.Rows, multiRow(res, "alone", "`outbox relay` (flags)", 1, alone.st), multiRow(res, "multi", "`outbox relay --config`", dbs*per, all.st))
	res.Tables = []Table{t}
	multiTargets(res)
	res.note("the lone relay's \"a db down\" column is its figure in the same window as the other's, whose database is down; its own database is up")
	return res, nil
}

// relayRun is one relay process under test, its busy outbox and its
// broker.
type relayRun struct {
	app    string // application_name of its connections
	busy   outbox.Tables
	addr   string // its --http
	b      *broker
	acks   *ackLog
	rd     *child
	p      *outbox.Producer
	st     multiStats
	prefix string
}

func (r *relayRun) close() {
	if r.rd != nil {
		r.rd.kill()
	}
	if r.b != nil {
		r.b.close()
	}
}

// multiStats is one relay process's figures.
type multiStats struct {
	mem               memStatus
	conns, listens    int64
	idleCPU           float64 // % of one core
	lat, latDown      []time.Duration
	latNote, downNote string
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
	} else {
		res.note("%s: latency in the second window not measured: %s", key, st.downNote)
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
	for _, k := range []struct{ key, name string }{{"p99_ms", "others idle"}, {"p99_down_ms", "a database down"}} {
		v, ok1 := m["multi.multi."+k.key]
		alone, ok2 := m["multi.alone."+k.key]
		if ok1 && ok2 {
			res.target("multi: busy outbox p99, "+k.name, "<= 1.5x alone, same window", fmt.Sprintf("%.2f ms vs %.2f ms alone (%.2fx)", v, alone, v/alone), v <= 1.5*alone)
		}
	}
}

// newMultiEnv creates dbs databases holding per outbox tables each, and
// the lone relay's table in the first.
func newMultiEnv(ctx context.Context, s *session, dbs, per int) (*multiEnv, error) {
	m := &multiEnv{s: s, id: randomID(), per: per}
	m.prefix = "benchmulti" + m.id + "_"
	var err error
	if m.dir, err = os.MkdirTemp("", "outbox-bench-multi-"); err != nil {
		return nil, err
	}
	for i := range dbs {
		name := fmt.Sprintf("bench_multi_%s_%d", m.id, i)
		if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+pgident.Quote(name)); err != nil {
			m.close()
			return nil, fmt.Errorf("create database %s (the role needs CREATEDB): %w", name, err)
		}
		m.dbs = append(m.dbs, name)
		tables := make([]outbox.Tables, per)
		for j := range tables {
			tables[j] = multiTables(j)
		}
		if i == 0 {
			tables = append(tables, aloneTable)
		}
		if err := migrateTables(ctx, databaseURL(s.cfg.DatabaseURL, name, "outbox_bench"), tables); err != nil {
			m.close()
			return nil, err
		}
	}
	pcfg, err := pgxpool.ParseConfig(databaseURL(s.cfg.DatabaseURL, m.dbs[0], "outbox_bench"))
	if err != nil {
		m.close()
		return nil, err
	}
	pcfg.MaxConns = int32(2*latencyWriters(s.cfg.Writers, multiRate) + 2)
	if m.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

func multiTables(j int) outbox.Tables {
	return outbox.Tables{Outbox: fmt.Sprintf("outbox_%d", j)}.WithDefaults()
}

func migrateTables(ctx context.Context, url string, tables []outbox.Tables) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, t := range tables {
		mg, err := migrate.New(t)
		if err != nil {
			return err
		}
		if _, err := mg.Up(ctx, conn); err != nil {
			return fmt.Errorf("migrate %s: %w", t.OutboxIdent(), err)
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
	if m.pool != nil {
		m.pool.Close()
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

// startBoth starts the lone relay and the relay of every outbox, each on
// a dev broker of its own, and waits until each has published a first
// event of its busy outbox.
func (m *multiEnv) startBoth(ctx context.Context) (alone, all *relayRun, err error) {
	alone = &relayRun{app: aloneAppName, busy: aloneTable, prefix: m.prefix + "alone_"}
	all = &relayRun{app: multiAppName, busy: multiTables(0), prefix: m.prefix + "all_"}
	for _, r := range []*relayRun{alone, all} {
		if r.b, err = m.s.startBroker(); err != nil {
			return alone, all, err
		}
		r.acks = newAckLog()
		r.b.dev.ControlKey(int16(kmsg.Produce), r.acks.control)
		if r.addr, err = freeAddr(); err != nil {
			return alone, all, err
		}
		if r.p, err = outbox.NewProducer(outbox.Config{Tables: r.busy, TopicPrefix: r.prefix}); err != nil {
			return alone, all, err
		}
	}
	m.s.progress("multi: the lone relay, and the relay of %d outboxes", len(m.dbs)*m.per)
	if alone.rd, err = startChild(ctx, m.s.cfg, "the lone relay", "relay", "--database-url", databaseURL(m.s.cfg.DatabaseURL, m.dbs[0], aloneAppName),
		"--table", aloneTable.Outbox, "--brokers", alone.b.addrs(), "--topic-prefix", alone.prefix, "--log-level", "warn", "--http", alone.addr); err != nil {
		return alone, all, err
	}
	if all.rd, err = m.startAll(ctx, all); err != nil {
		return alone, all, err
	}
	for _, r := range []*relayRun{alone, all} {
		if err := m.awaitReady(ctx, r, func(string) bool { return true }); err != nil {
			return alone, all, err
		}
		// Warm up: one event, through, before anything is counted.
		if err := m.emitOne(ctx, r); err != nil {
			return alone, all, err
		}
		if err := awaitAcks(r.rd, r.acks, 1, 60*time.Second); err != nil {
			return alone, all, fmt.Errorf("warm-up: %w", err)
		}
	}
	return alone, all, nil
}

// startAll starts the relay of every outbox, from a config file.
func (m *multiEnv) startAll(ctx context.Context, r *relayRun) (*child, error) {
	var f strings.Builder
	fmt.Fprintf(&f, "brokers: %q\ntopic-prefix: %q\nlog-level: warn\nhttp: %q\noutboxes:\n", r.b.addrs(), r.prefix, r.addr)
	for i, db := range m.dbs {
		u := databaseURL(m.s.cfg.DatabaseURL, db, multiAppName)
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

// multiSettled is how long after its start a relay is measured idle: the
// start's one-off work (first cleanup and watchdog runs) has passed, and
// the connections it opened have been idle long enough to be closed (the
// relay closes those idle for 30s, looking every 10s).
const multiSettled = 45 * time.Second

// measure measures both relays at once: idle CPU, connections, then the
// busy outboxes' latencies in two windows, the second with the last
// database down, then memory; and stops them.
func (m *multiEnv) measure(ctx context.Context, runs []*relayRun, idle, window time.Duration) error {
	if err := runs[0].rd.sleep(3*time.Second, "while settling"); err != nil {
		return err
	}
	c0 := make([]time.Duration, len(runs))
	for i, r := range runs {
		var err error
		if c0[i], err = cputime.Process(r.rd.cmd.Process.Pid); err != nil {
			return err
		}
	}
	start := time.Now()
	if err := runs[0].rd.sleep(idle, "while idle"); err != nil {
		return err
	}
	for i, r := range runs {
		c1, err := cputime.Process(r.rd.cmd.Process.Pid)
		if err != nil {
			return err
		}
		r.st.idleCPU = 100 * float64(c1-c0[i]) / float64(time.Since(start))
	}
	last := runs[len(runs)-1].rd.started
	if wait := time.Until(last.Add(pick(m.s.cfg.Short, 0, multiSettled))); wait > 0 {
		if err := runs[0].rd.sleep(wait, "while idle"); err != nil {
			return err
		}
	}
	for _, r := range runs {
		err := m.s.admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN %')
FROM pg_stat_activity WHERE application_name = $1`, r.app).Scan(&r.st.conns, &r.st.listens)
		if err != nil {
			return err
		}
	}
	m.s.progress("multi: both busy outboxes at %d events/s", multiRate)
	if err := m.busyLatencies(ctx, runs, window, func(r *relayRun, lat []time.Duration, note string) { r.st.lat, r.st.latNote = lat, note }); err != nil {
		return err
	}
	m.s.progress("multi: again, with a database of the relay of every outbox down")
	if err := m.databaseDown(ctx, runs[len(runs)-1]); err != nil {
		return err
	}
	if err := m.busyLatencies(ctx, runs, window, func(r *relayRun, lat []time.Duration, note string) { r.st.latDown, r.st.downNote = lat, note }); err != nil {
		return err
	}
	for _, r := range runs {
		var err error
		if r.st.mem, err = r.rd.memory(); err != nil {
			return err
		}
		if err := r.rd.stop(); err != nil {
			return err
		}
	}
	return nil
}

// busyLatencies emits into every run's busy outbox at multiRate for
// window, all at once, and hands each run its commit-to-ack latencies.
func (m *multiEnv) busyLatencies(ctx context.Context, runs []*relayRun, window time.Duration, set func(*relayRun, []time.Duration, string)) error {
	type out struct {
		em    emitOutcome
		clock *ackClock
		err   error
	}
	outs := make([]out, len(runs))
	before := make([]int64, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		before[i] = r.acks.count()
		outs[i].clock = &ackClock{acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
		e := &env{s: m.s, id: m.id, schema: outbox.DefaultSchema, tables: r.busy, pool: m.pool}
		wg.Go(func() {
			outs[i].em, outs[i].err = emitAtRate(ctx, m.s, e, r.p, outs[i].clock, latencyRun{rate: multiRate}, window, latencyWriters(m.s.cfg.Writers, multiRate))
		})
	}
	wg.Wait()
	for i, r := range runs {
		if outs[i].err != nil {
			return outs[i].err
		}
		if err := awaitAcks(r.rd, r.acks, before[i]+outs[i].em.events, 60*time.Second); err != nil {
			return err
		}
		lat, note := r.acks.latencies(ctx, r.b, r.prefix+"order", outs[i].clock)
		set(r, lat, note)
	}
	return nil
}

// databaseDown makes the last database refuse connections and ends its
// sessions, and waits until the relay of every outbox reports the
// outboxes on it not ready.
func (m *multiEnv) databaseDown(ctx context.Context, r *relayRun) error {
	down := m.dbs[len(m.dbs)-1]
	if _, err := m.s.admin.Exec(ctx, "ALTER DATABASE "+pgident.Quote(down)+" ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("make database %s unreachable: %w", down, err)
	}
	if _, err := m.s.admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", down); err != nil {
		return err
	}
	prefix := fmt.Sprintf("db%d.", len(m.dbs)-1)
	return m.awaitReady(ctx, r, func(name string) bool { return !strings.HasPrefix(name, prefix) })
}

// awaitReady waits until r's /outboxes shows every outbox ready or not
// as want says.
func (m *multiEnv) awaitReady(ctx context.Context, r *relayRun, want func(name string) bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		ok, got := outboxesReady(ctx, r.addr, want)
		if ok {
			return nil
		}
		if got != "" {
			last = got
		}
		if err := r.rd.sleep(200*time.Millisecond, "while starting"); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s: the outboxes were not ready as expected within 2 minutes: %s", r.rd.name, last)
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

func (m *multiEnv) emitOne(ctx context.Context, r *relayRun) error {
	return pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error {
		_, err := r.p.Emit(ctx, tx, outbox.Event{AggregateID: [16]byte{1}, Type: "order.placed", Payload: newOrder(0)})
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
