package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// The broker is replaced under a running relay and consumer: the dev
// broker is killed (SIGKILL) and a new one, with no data, starts on the
// same port, so every topic has a new id, as when a topic is deleted and
// recreated. Both say so within 5s of the broker going away (with the
// default --delivery-timeout of 30s), the relay's /readyz turns unready,
// and both follow the new broker by themselves: within 30s of its start
// every event committed meanwhile is on it, in order per aggregate, and
// processed once by the consumer; /readyz is ready again.
func TestBrokerReplacedUnderRelayAndConsumer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a broker killed and replaced; skipped with -short")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	addr := freeAddr(t)
	broker := start(t, "dev-kafka", "--listen", addr, "--partitions", "3")
	waitListening(t, addr)
	web := freeAddr(t)
	rel := start(t, "relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--brokers", addr,
		"--batch-size", "500", "--poll-interval", "100ms", "--http", web)
	cons := start(t, "consume", "--database-url", db.URL, "--schema", db.Tables.Schema, "--brokers", addr,
		"--topics", "order", "--name", "heal", "--json")
	waitListening(t, web)

	first := writers(t, ctx, db, 1_000, 50, 2, 20, time.Second)
	require.Eventually(t, func() bool { return processed(t, db, "heal") == 1_000 }, 60*time.Second, 50*time.Millisecond,
		"the consumer did not process the first events; consumer output:\n%s", cons.out.String())
	code, body := readyz(t, web)
	require.Equal(t, http.StatusOK, code, body)

	relBefore, consBefore := len(rel.out.String()), len(cons.out.String())
	broker.signal(t, syscall.SIGKILL)
	broker.wait(t, 10*time.Second)
	gone := time.Now()
	written := make(chan map[uuid.UUID][]int64, 1)
	go func() { written <- writers(t, ctx, db, 2_000, 50, 2, 20, 8*time.Second) }()

	said := func(p *proc, from int) func() bool {
		return func() bool { return strings.Contains(p.out.String()[from:], "cannot connect to Kafka broker") }
	}
	require.Eventually(t, said(rel, relBefore), 5*time.Second, 20*time.Millisecond, "the relay says nothing of the broker; output:\n%s", rel.out.String()[relBefore:])
	require.Eventually(t, said(cons, consBefore), 5*time.Second, 20*time.Millisecond, "the consumer says nothing of the broker; output:\n%s", cons.out.String()[consBefore:])
	t.Logf("both logged the broker's absence within %s", time.Since(gone).Round(time.Millisecond))
	require.Eventually(t, func() bool { code, _ := readyz(t, web); return code == http.StatusServiceUnavailable },
		5*time.Second, 50*time.Millisecond, "/readyz still ready without a broker")

	time.Sleep(time.Until(gone.Add(3 * time.Second)))
	broker = start(t, "dev-kafka", "--listen", addr, "--partitions", "3")
	waitListening(t, addr)
	back := time.Now()
	second := <-written
	want := 0
	for _, ids := range second {
		want += len(ids)
	}
	require.Equal(t, 2_000, want)
	var drained time.Duration
	require.Eventually(t, func() bool {
		if drained == 0 && pending(t, db) == 0 {
			drained = time.Since(back)
		}
		return pending(t, db) == 0 && processed(t, db, "heal") == 3_000
	}, time.Until(back.Add(30*time.Second)), 100*time.Millisecond,
		"not healed within 30s of the new broker: %d pending, %d processed; relay output:\n%s\nconsumer output:\n%s",
		pending(t, db), processed(t, db, "heal"), rel.out.String()[relBefore:], cons.out.String()[consBefore:])
	healed := time.Since(back)
	require.Eventually(t, func() bool { code, _ := readyz(t, web); return code == http.StatusOK }, 10*time.Second, 50*time.Millisecond,
		"/readyz not ready again once the relay publishes")
	t.Logf("healed %s after the new broker started (relay drained after %s)", healed.Round(time.Millisecond), drained)

	// Everything committed since the kill is on the new broker, in order
	// per aggregate; the consumer processed each event once, in order per
	// aggregate.
	got := readTopic(t, addr, "order", want, 30*time.Second)
	dups := verify(t, second, got)
	t.Logf("%d records on the new broker, %d duplicates", len(got), dups)
	all := maps.Clone(first)
	for agg, ids := range second {
		all[agg] = append(all[agg], ids...)
	}
	consumedInOrder(t, cons.out.String(), all)

	rel.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, rel.wait(t, 30*time.Second))
	cons.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, cons.wait(t, 30*time.Second))
	broker.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, broker.wait(t, 30*time.Second))
}

// processed counts the processed table's rows of consumer.
func processed(t *testing.T, db *pgtest.DB, consumer string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.ProcessedIdent()+" WHERE consumer = $1", consumer).Scan(&n))
	return n
}

func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// consumedInOrder checks the events `outbox consume --json` printed in
// out: every committed event, none other, and each aggregate's first
// in ascending id order.
func consumedInOrder(t *testing.T, out string, committed map[uuid.UUID][]int64) {
	t.Helper()
	want := map[int64]uuid.UUID{}
	for agg, ids := range committed {
		for _, id := range ids {
			want[id] = agg
		}
	}
	seen := map[int64]bool{}
	last := map[uuid.UUID]int64{}
	for line := range strings.SplitSeq(out, "\n") {
		if !strings.HasPrefix(line, `{"event_id"`) {
			continue
		}
		var ev struct {
			ID  int64     `json:"event_id"`
			Agg uuid.UUID `json:"aggregate_id"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
		agg, ok := want[ev.ID]
		require.True(t, ok, "consumed event %d was never committed", ev.ID)
		require.Equal(t, agg, ev.Agg)
		if seen[ev.ID] {
			continue
		}
		seen[ev.ID] = true
		require.Greater(t, ev.ID, last[agg], "aggregate %s: event %d consumed after %d", agg, ev.ID, last[agg])
		last[agg] = ev.ID
	}
	require.Len(t, seen, len(want), "every committed event consumed")
}

// The WAL relay shares the polling relay's publisher: a broker replaced
// under `outbox relay --mode wal` (an in-process dev broker closed, and a
// new one without data started on its address) is logged within 5s,
// /readyz turns unready, and within 30s of the new broker every event
// committed meanwhile is on it, in order per aggregate, and /readyz is
// ready again.
func TestBrokerReplacedUnderWALRelay(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a broker replaced under the WAL relay; skipped with -short")
	}
	ctx := context.Background()
	w := walSetup(t)
	addr := freeAddr(t)
	startBroker := func() {
		b, err := devkafka.Start(devkafka.Config{Listen: addr, Partitions: 3})
		require.NoError(t, err)
		t.Cleanup(b.Close)
		w.broker = b
	}
	startBroker()
	web := freeAddr(t)
	// The default --delivery-timeout (30s), after walArgs' 2s.
	rel := start(t, w.walArgs("wal", "--http", web, "--delivery-timeout", "30s")...)
	w.waitStreaming(t, rel)
	waitListening(t, web)

	first := writers(t, ctx, w.db, 500, 50, 2, 20, time.Second)
	readTopic(t, addr, "order", 500, 60*time.Second)

	before := len(rel.out.String())
	w.broker.Close()
	gone := time.Now()
	written := make(chan map[uuid.UUID][]int64, 1)
	go func() { written <- writers(t, ctx, w.db, 1_000, 50, 2, 20, 6*time.Second) }()
	require.Eventually(t, func() bool { return strings.Contains(rel.out.String()[before:], "cannot connect to Kafka broker") },
		5*time.Second, 20*time.Millisecond, "the WAL relay says nothing of the broker; output:\n%s", rel.out.String()[before:])
	require.Eventually(t, func() bool { code, _ := readyz(t, web); return code == http.StatusServiceUnavailable },
		5*time.Second, 50*time.Millisecond, "/readyz still ready without a broker")

	time.Sleep(time.Until(gone.Add(3 * time.Second)))
	startBroker()
	back := time.Now()
	second := <-written
	ofFirst, ofSecond := ids(first), ids(second)
	var got []delivered
	for _, r := range kafkatest.Read(t, addr, time.Until(back.Add(30*time.Second)), func(rs []*kgo.Record) bool {
		seen := map[int64]bool{}
		for _, r := range rs {
			if id := kafkatest.EventID(r); ofSecond[id] {
				seen[id] = true
			}
		}
		return len(seen) == len(ofSecond)
	}, "order") {
		got = append(got, delivered{key: string(r.Key), partition: r.Partition, id: kafkatest.EventID(r)})
	}
	t.Logf("healed %s after the new broker started", time.Since(back).Round(time.Millisecond))
	require.Eventually(t, func() bool { code, _ := readyz(t, web); return code == http.StatusOK }, 10*time.Second, 50*time.Millisecond,
		"/readyz not ready again once the relay publishes")

	// A batch in flight at the change may be sent again: what is not of
	// the second load must be of the first.
	var fromSecond []delivered
	for _, d := range got {
		if !ofSecond[d.id] {
			require.True(t, ofFirst[d.id], "event %d was never committed", d.id)
			continue
		}
		fromSecond = append(fromSecond, d)
	}
	dups := verify(t, second, fromSecond)
	t.Logf("%d records on the new broker, %d duplicates", len(got), dups)

	rel.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, rel.wait(t, 30*time.Second))
}

// ids is the set of the ids in committed.
func ids(committed map[uuid.UUID][]int64) map[int64]bool {
	out := map[int64]bool{}
	for _, ids := range committed {
		for _, id := range ids {
			out[id] = true
		}
	}
	return out
}
