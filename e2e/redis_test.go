package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// redisServer is a redis-server of the test's own, on a free port, with
// an append-only file fsynced on every write, so that a SIGKILL loses no
// acknowledged entry and a restart finds them.
type redisServer struct {
	t    *testing.T
	port int
	dir  string
	cmd  *exec.Cmd
}

func startRedis(t *testing.T) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed; .ci/run installs it")
		}
		t.Skip("redis-server is not installed (apt-get install redis-server)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	s := &redisServer{t: t, port: port, dir: t.TempDir()}
	s.run()
	t.Cleanup(s.kill)
	return s
}

func (s *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// url is the relay's --sink for the server, with extra query parameters.
func (s *redisServer) url(query string) string {
	u := "redis://" + s.addr() + "/0"
	if query != "" {
		u += "?" + query
	}
	return u
}

func (s *redisServer) run() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", s.dir)
	require.NoError(s.t, s.cmd.Start())
	c := redis.NewClient(&redis.Options{Addr: s.addr()})
	defer c.Close()
	require.Eventually(s.t, func() bool { return c.Ping(context.Background()).Err() == nil },
		30*time.Second, 50*time.Millisecond, "redis-server on port %d did not answer", s.port)
}

func (s *redisServer) kill() {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

func (s *redisServer) client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr()})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// readStream reads the whole stream, in stream order, as delivered
// records for verify (one "partition": a stream keeps one order).
func (s *redisServer) readStream(stream string) []delivered {
	s.t.Helper()
	entries, err := s.client().XRange(context.Background(), stream, "-", "+").Result()
	require.NoError(s.t, err)
	out := make([]delivered, 0, len(entries))
	for _, e := range entries {
		id, err := strconv.ParseInt(fmt.Sprint(e.Values[outbox.HeaderEventID]), 10, 64)
		require.NoError(s.t, err, "entry %s has no event_id", e.ID)
		out = append(out, delivered{key: fmt.Sprint(e.Values[outbox.HeaderAggregateID]), id: id,
			source: fmt.Sprint(e.Values[outbox.HeaderEventSource])})
	}
	return out
}

func redisRelayArgs(db *pgtest.DB, sink string, extra ...string) []string {
	return append([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--sink", sink,
		"--batch-size", strconv.Itoa(batchSize), "--poll-interval", "100ms", "--delivery-timeout", "2s", "--log-level", "warn"}, extra...)
}

// drained waits until the outbox has no pending row, then stops p.
func drained(t *testing.T, db *pgtest.DB, p *proc) {
	t.Helper()
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 180*time.Second, 100*time.Millisecond,
		"outbox did not drain; relayer output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())
}

// SIGKILL the relay ten times during a 20,000-event load to Redis: every
// committed event is in the stream, each aggregate's in order, duplicates
// bounded by a batch per kill.
func TestRedisRelayerSurvivesTenSIGKILLs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("20,000 events and ten process kills; skipped with -short")
	}
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	rs := startRedis(t)
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, context.Background(), db, 20_000, 300, 4, 50, 3*time.Second) }()
	p := start(t, redisRelayArgs(db, rs.url(""))...)
	for range 10 {
		time.Sleep(time.Duration(150+rand.IntN(500)) * time.Millisecond)
		p.signal(t, syscall.SIGKILL)
		p.wait(t, 10*time.Second)
		p = start(t, redisRelayArgs(db, rs.url(""))...)
	}
	committed := <-done
	drained(t, db, p)
	got := rs.readStream("order")
	dups := verify(t, committed, got)
	t.Logf("20,000 events, 10 SIGKILLs: %d entries, %d duplicates (bound %d)", len(got), dups, 10*batchSize)
	require.LessOrEqual(t, dups, 10*batchSize)
}

// The Redis server is SIGKILLed mid-drain and restarted on its port with
// its append-only file: the relay backs off, resumes, and nothing is
// lost or reordered.
func TestRedisServerKilledMidDrain(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a Redis kill and restart; skipped with -short")
	}
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	rs := startRedis(t)
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, context.Background(), db, 20_000, 300, 4, 50, 4*time.Second) }()
	p := start(t, redisRelayArgs(db, rs.url(""))...)
	require.Eventually(t, func() bool { return rs.client().XLen(context.Background(), "order").Val() > 2000 },
		60*time.Second, 20*time.Millisecond, "the relay never published; output:\n%s", p.out.String())
	rs.kill()
	time.Sleep(2 * time.Second)
	require.Positive(t, pending(t, db), "events wait while Redis is down")
	rs.run()
	committed := <-done
	drained(t, db, p)
	got := rs.readStream("order")
	dups := verify(t, committed, got)
	t.Logf("20,000 events, Redis killed and restarted: %d entries, %d duplicates", len(got), dups)
}

// Three relays at once share the outbox: each aggregate's events reach
// the stream in order, none lost.
func TestRedisThreeRelaysKeepOrder(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("three relays over 10,000 events; skipped with -short")
	}
	db := pgtest.New(t, pgtest.Options{MaxConns: 16})
	rs := startRedis(t)
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, context.Background(), db, 10_000, 50, 4, 20, 3*time.Second) }()
	var ps []*proc
	for i := range 3 {
		ps = append(ps, start(t, redisRelayArgs(db, rs.url(""), "--source", fmt.Sprintf("relay-%d", i))...))
	}
	committed := <-done
	for _, p := range ps {
		drained(t, db, p)
	}
	got := rs.readStream("order")
	dups := verify(t, committed, got)
	by := map[string]int{}
	for _, d := range got {
		by[d.source]++
	}
	t.Logf("10,000 events, 3 relays: entries per relay %v, %d duplicates", by, dups)
}

// Each poison shape is held on its own row with its reason while the rows
// beside it go through: an entry larger than ?max_bytes (too_large), a
// type that names no valid stream key (invalid_topic), a stream key that
// holds a string (WRONGTYPE: invalid_topic), and a row whose own headers
// use aggregate_id (reserved_header).
func TestRedisPoisonHeldOnItsRow(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rs := startRedis(t)
	ctx := context.Background()
	require.NoError(t, rs.client().Set(ctx, "taken", "a string", 0).Err())
	want := map[int64]string{
		db.InsertLegacy(t, uuid.New(), "order.big", `jsonb_build_object('pad', repeat('x', 3000))`, `'{}'`): "too_large",
		db.InsertLegacy(t, uuid.New(), "bad stream.x", `'{}'`, `'{}'`):                                      "invalid_topic",
		db.InsertLegacy(t, uuid.New(), "taken.x", `'{}'`, `'{}'`):                                           "invalid_topic",
		db.InsertLegacy(t, uuid.New(), "order.spoof", `'{}'`, `'{"aggregate_id": "x"}'`):                    "reserved_header",
	}
	var good []int64
	for range 20 {
		good = append(good, db.InsertRaw(t, uuid.New(), "order.placed", `'{"ok": true}'`, `'{}'`))
	}
	p := start(t, redisRelayArgs(db, rs.url("max_bytes=2000"))...)
	failures := migrate.FailuresIdent(db.Tables)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+failures).Scan(&n))
		return n == len(want) && pending(t, db) == len(want)
	}, 60*time.Second, 100*time.Millisecond, "poison rows not all held; output:\n%s", p.out.String())
	rows, err := db.Pool.Query(ctx, "SELECT event_id, reason, error FROM "+failures)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var reason, msg string
		require.NoError(t, rows.Scan(&id, &reason, &msg))
		require.Equal(t, want[id], reason, "row %d: %s", id, msg)
	}
	require.NoError(t, rows.Err())
	var ids []string
	for _, d := range rs.readStream("order") {
		ids = append(ids, strconv.FormatInt(d.id, 10))
	}
	for _, id := range good {
		require.Contains(t, ids, strconv.FormatInt(id, 10), "good row %d delivered", id)
	}
	require.Len(t, ids, len(good), "only the good rows reached the stream: %s", strings.Join(ids, ","))
	p.signal(t, syscall.SIGTERM)
	p.wait(t, 30*time.Second)
}

// The WAL source publishes to Redis through the same --sink: every event
// a mixed load (Emit and plain INSERTs) committed reaches the stream, each
// aggregate's in order.
func TestRedisWALSource(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a WAL relay over 5,000 events; skipped with -short")
	}
	w := walSetup(t)
	rs := startRedis(t)
	p := start(t, redisRelayArgs(w.db, rs.url(""), "--mode", "wal", "--source", "wal-redis", "--heartbeat-interval", "500ms")...)
	w.waitStreaming(t, p)
	l := produce(t, w.db, 5_000, 10*time.Millisecond, nil)
	w.walDrained(t, l.last, p)
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())
	got := rs.readStream("order")
	dups := verify(t, l.committed, got)
	t.Logf("WAL source to Redis: %d events, %d entries, %d duplicates", l.events, len(got), dups)
}
