package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay/walrelay"
	"github.com/pgoutbox/outbox/routing"
)

// natsPrefix is the topic prefix of the NATS tests: their stream captures
// "e2e.>".
const natsPrefix = "e2e."

func natsRelayArgs(db *pgtest.DB, url string, extra ...string) []string {
	return append([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--sink", url,
		"--topic-prefix", natsPrefix, "--batch-size", fmt.Sprint(batchSize), "--poll-interval", "100ms",
		"--delivery-timeout", "2s", "--log-level", "warn"}, extra...)
}

// natsSetup starts a private nats-server with a stream EVENTS capturing
// the tests' subjects.
func natsSetup(t *testing.T, cfg jetstream.StreamConfig) (*natstest.Server, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	if cfg.Name == "" {
		cfg.Name = "EVENTS"
	}
	if cfg.Subjects == nil {
		cfg.Subjects = []string{natsPrefix + ">"}
	}
	natstest.AddStream(t, js, cfg)
	return srv, js
}

// natsDelivered reads the stream EVENTS back as delivered records (one
// "partition": a stream keeps one order).
func natsDelivered(t *testing.T, js jetstream.JetStream) []delivered {
	t.Helper()
	var out []delivered
	for _, m := range natstest.ReadStream(t, js, "EVENTS", "") {
		id, err := strconv.ParseInt(m.Header.Get(outbox.HeaderEventID), 10, 64)
		require.NoError(t, err)
		out = append(out, delivered{key: m.Header.Get(outbox.HeaderAggregateID), id: id, source: m.Header.Get(outbox.HeaderEventSource)})
	}
	return out
}

// Ten SIGKILLs of the relay during a 20,000-event load: every committed
// event is in the stream, in order per aggregate; a batch a killed relay
// had published but not marked is sent again, and the stream drops those
// copies by Nats-Msg-Id, so duplicates stay bounded (and are counted).
func TestNATSRelayerSurvivesTenSIGKILLs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("20,000 events and ten process kills; skipped with -short")
	}
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	srv, js := natsSetup(t, jetstream.StreamConfig{})

	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, ctx, db, 20_000, 500, 4, 50, 3*time.Second) }()
	p := start(t, natsRelayArgs(db, srv.URL())...)
	http := freeAddr(t)
	for i := range 10 {
		time.Sleep(time.Duration(150+rand.IntN(600)) * time.Millisecond)
		p.signal(t, syscall.SIGKILL)
		p.wait(t, 10*time.Second)
		var extra []string
		if i == 9 {
			extra = []string{"--http", http}
		}
		p = start(t, natsRelayArgs(db, srv.URL(), extra...)...)
	}
	waitListening(t, http)
	committed := <-done
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 180*time.Second, 100*time.Millisecond, "outbox did not drain; relayer output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())

	got := natsDelivered(t, js)
	dups := verify(t, committed, got)
	t.Logf("20,000 events, 10 SIGKILLs: %d messages in the stream, %d duplicates (bound %d)", len(got), dups, 10*batchSize)
	require.LessOrEqual(t, dups, 10*batchSize, "duplicates bounded by one batch per kill")
}

// Three relays drain one outbox at once into one stream: every event is
// there, and each aggregate's events are in commit order.
func TestNATSThreeRelaysKeepOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	srv, js := natsSetup(t, jetstream.StreamConfig{})
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, ctx, db, 10_000, 50, 4, 20, 2*time.Second) }()
	var procs []*proc
	for i := range 3 {
		procs = append(procs, start(t, natsRelayArgs(db, srv.URL(), "--source", fmt.Sprintf("r%d", i))...))
	}
	committed := <-done
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 120*time.Second, 100*time.Millisecond, "outbox did not drain")
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t, 30*time.Second))
	}
	got := natsDelivered(t, js)
	sources := map[string]int{}
	for _, d := range got {
		sources[d.source]++
	}
	dups := verify(t, committed, got)
	t.Logf("10,000 events over 50 aggregates by 3 relays: %d duplicates; per relay %v", dups, sources)
	require.Zero(t, dups, "no crash, no failure: nothing is sent twice")
}

// Each poison shape is held on its own row with its reason, and the rows
// beside it (of other aggregates) go through: too large for the stream's
// max_msg_size, a subject no stream captures, a row header the NATS sink
// reserves (aggregate_id).
func TestNATSPoisonRowsHeld(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	srv, js := natsSetup(t, jetstream.StreamConfig{Subjects: []string{natsPrefix + "order.>"}, MaxMsgSize: 4096})
	big := db.InsertRaw(t, uuid.New(), "order.placed", `jsonb_build_object('pad', repeat('x', 5000))`, "NULL")
	noStream := db.InsertRaw(t, uuid.New(), "invoice.sent", `'{}'`, "NULL")
	reserved := db.InsertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'{"aggregate_id": "mine"}'`)
	var good []int64
	for range 20 {
		good = append(good, db.InsertRaw(t, uuid.New(), "order.placed", `'{"ok": true}'`, "NULL"))
	}
	p := start(t, natsRelayArgs(db, srv.URL())...)
	want := map[int64]string{big: "too_large", noStream: "invalid_topic", reserved: "reserved_header"}
	reasons := func() map[int64]string {
		rows, err := db.Pool.Query(context.Background(), "SELECT event_id, reason FROM "+migrate.FailuresIdent(db.Tables))
		require.NoError(t, err)
		out := map[int64]string{}
		for rows.Next() {
			var id int64
			var r string
			require.NoError(t, rows.Scan(&id, &r))
			out[id] = r
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Eventually(t, func() bool { return pending(t, db) == 3 && len(reasons()) == 3 }, 60*time.Second, 100*time.Millisecond,
		"only the three poison rows stay pending, each held; relayer output:\n%s", p.out.String())
	require.Equal(t, want, reasons())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))
	var ids []int64
	for _, d := range natsDelivered(t, js) {
		ids = append(ids, d.id)
	}
	require.ElementsMatch(t, good, ids)
}

// The server is killed (SIGKILL) mid-drain and started again on its port
// and store: the relay backs off, reconnects, and every event is in the
// stream, in order per aggregate.
func TestNATSServerKilledMidDrain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	srv, _ := natsSetup(t, jetstream.StreamConfig{})
	committed := writers(t, ctx, db, 20_000, 500, 4, 100, 0)
	p := start(t, natsRelayArgs(db, srv.URL(), "--batch-size", "200")...)
	require.Eventually(t, func() bool { return pending(t, db) < 15_000 }, 60*time.Second, 20*time.Millisecond, "the relay should be draining")
	srv.Kill()
	left := pending(t, db)
	time.Sleep(2 * time.Second) // the relay meets a dead server for a while
	srv.Restart()
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 120*time.Second, 100*time.Millisecond, "outbox did not drain after the restart; relayer output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))
	_, js := natstest.Connect(t, srv.URL()) // a connection that never saw the server die
	got := natsDelivered(t, js)
	dups := verify(t, committed, got)
	t.Logf("20,000 events, server killed with %d pending: %d duplicates", left, dups)
}

// natscli, a client the project did not write, reads the relayed events
// back from the stream: the payload as Postgres wrote it and every header,
// byte for byte.
func TestNATSReadBackWithNatsCLI(t *testing.T) {
	t.Parallel()
	natsCLI, err := exec.LookPath("nats")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("natscli (nats) is missing; .ci/run installs it")
		}
		t.Skip("natscli (nats) is missing; go install github.com/nats-io/natscli/nats@v0.5.0")
	}
	db := pgtest.New(t)
	srv, _ := natsSetup(t, jetstream.StreamConfig{})
	hdrs := `'{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "note": "Grüße, 東京", "odd key": " padded "}'`
	agg := uuid.New()
	var ids []int64
	for _, payload := range []string{`'{"name": "Zoë — 東京 🚀", "html": "<b>a & b</b>"}'`, `'{}'`, `'{"a": [1, 2, {"c": null}], "d": 1.50}'`} {
		ids = append(ids, db.InsertRaw(t, agg, "order.placed", payload, hdrs))
	}
	p := start(t, natsRelayArgs(db, srv.URL(), "--source", "shop")...)
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 30*time.Second, 50*time.Millisecond, "relayer output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))

	dir := t.TempDir()
	cmd := exec.Command(natsCLI, "--server", srv.URL(), "sub", natsPrefix+"order.placed", "--stream", "EVENTS", "--all",
		"--count", strconv.Itoa(len(ids)), "--dump", dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "nats sub: %s", out)
	for n, id := range ids {
		raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%d.json", n+1)))
		require.NoError(t, err, "nats sub dumped %s", out)
		var m struct {
			Subject string
			Header  map[string][]string
			Data    []byte
		}
		require.NoError(t, json.Unmarshal(raw, &m))
		var payload, headers string
		require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT payload::text, headers::text FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).Scan(&payload, &headers))
		require.Equal(t, payload, string(m.Data), "event %d's payload, byte for byte", id)
		require.Equal(t, natsPrefix+"order.placed", m.Subject)
		got := map[string]string{}
		for k, vs := range m.Header {
			require.Len(t, vs, 1, k)
			name, value, err := routing.UnescapeNATSHeader(k, vs[0])
			require.NoError(t, err)
			got[name] = value
		}
		var own map[string]string
		require.NoError(t, json.Unmarshal([]byte(headers), &own))
		want := map[string]string{"event_id": strconv.FormatInt(id, 10), "event_type": "order.placed", "content-type": "application/json",
			"event_source": "shop", "aggregate_id": agg.String(), "Nats-Msg-Id": "shop:" + strconv.FormatInt(id, 10)}
		for k, v := range own {
			want[k] = v
		}
		require.Equal(t, want, got, "event %d's headers", id)
		require.True(t, strings.HasPrefix(m.Header["~odd%20key"][0], "%20padded"), "the header NATS cannot carry travels escaped")
	}
}

// `outbox relay --mode wal` publishes to NATS through the same --sink:
// every committed event reaches the stream, in order per aggregate.
func TestNATSWALRelay(t *testing.T) {
	t.Parallel()
	url := needLogical(t)
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12, ServerURL: url})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil && walrelay.Teardown(ctx, db.Pool, slot, slot) != nil {
			time.Sleep(100 * time.Millisecond)
		}
	})
	srv, js := natsSetup(t, jetstream.StreamConfig{})
	p := start(t, natsRelayArgs(db, srv.URL(), "--mode", "wal", "--source", "wal", "--heartbeat-interval", "500ms")...)
	require.Eventually(t, func() bool { return readSlot(t, db.Pool, slot).streaming() }, 30*time.Second, 20*time.Millisecond,
		"the WAL relay never streamed; output:\n%s", p.out.String())
	committed := writers(t, ctx, db, 5_000, 100, 4, 50, time.Second)
	stored := func() int {
		s, err := js.Stream(ctx, "EVENTS")
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		return int(info.State.Msgs)
	}
	require.Eventually(t, func() bool { return stored() >= 5_000 }, 120*time.Second, 100*time.Millisecond, "relayer output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))
	dups := verify(t, committed, natsDelivered(t, js))
	t.Logf("WAL relay to NATS: 5,000 events, %d duplicates", dups)
}
