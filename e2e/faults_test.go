package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/ops"
)

const batchSize = 500

func relayArgs(db *pgtest.DB, brokers string, extra ...string) []string {
	return append([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--brokers", brokers,
		"--batch-size", fmt.Sprint(batchSize), "--poll-interval", "100ms", "--delivery-timeout", "2s", "--log-level", "warn"}, extra...)
}

// SIGKILL a relayer process at random moments, ten times, during a
// 50,000-event run, restarting it each time: every committed event is in
// Kafka, order per aggregate holds, duplicates are bounded by the batch
// size per kill.
func TestRelayerSurvivesTenSIGKILLs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("50,000 events and ten process kills; skipped with -short")
	}
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	b, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(t, err)
	t.Cleanup(b.Close)

	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, ctx, db, 50_000, 500, 4, 50, 3*time.Second) }()

	p := start(t, relayArgs(db, b.Addr())...)
	// The last relayer may find everything drained at once: it serves
	// --http, so the test can see it is up (its signal handler is
	// installed before its HTTP listener) before it gets its SIGTERM.
	http := freeAddr(t)
	for i := range 10 {
		time.Sleep(time.Duration(150+rand.IntN(600)) * time.Millisecond)
		p.signal(t, syscall.SIGKILL)
		p.wait(t, 10*time.Second)
		var extra []string
		if i == 9 {
			extra = []string{"--http", http}
		}
		p = start(t, relayArgs(db, b.Addr(), extra...)...)
	}
	waitListening(t, http)
	committed := <-done
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 180*time.Second, 100*time.Millisecond, "outbox did not drain; relayer output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())

	got := readTopic(t, b.Addr(), "order", 50_000, 60*time.Second)
	dups := verify(t, committed, got)
	t.Logf("50,000 events, 10 SIGKILLs: %d records read, %d duplicates (bound %d)", len(got), dups, 10*batchSize)
	require.LessOrEqual(t, dups, 10*batchSize, "duplicates bounded by one batch per kill")
}

// The broker goes away for 10 s mid-run (the dev broker process is
// stopped) and comes back on the same port with its data: the relayer backs
// off, resumes by itself, loses nothing; the lag grows during the outage and
// the relayer's error metrics count it.
func TestBrokerOutageOfTenSeconds(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a 10 s outage; skipped with -short")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	data := filepath.Join(t.TempDir(), "kafka")
	addr := freeAddr(t)
	broker := start(t, "dev-kafka", "--listen", addr, "--partitions", "3", "--data", data)
	waitListening(t, addr)
	metrics := freeAddr(t)
	p := start(t, relayArgs(db, addr, "--http", metrics)...)

	first := writers(t, ctx, db, 2_000, 50, 2, 20, time.Second)
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 60*time.Second, 50*time.Millisecond)

	broker.signal(t, syscall.SIGTERM) // a clean stop persists the broker's state to --data
	require.Equal(t, 0, broker.wait(t, 10*time.Second))
	outage := time.Now()
	second := writers(t, ctx, db, 2_000, 50, 2, 20, 2*time.Second)
	time.Sleep(time.Until(outage.Add(10 * time.Second)))
	s, err := ops.ReadStats(ctx, db.Pool, ops.StatsConfig{Tables: db.Tables, StuckAfter: 5 * time.Minute})
	require.NoError(t, err)
	require.Positive(t, s.Pending, "nothing can be dispatched while the broker is away")
	require.Greater(t, s.OldestPendingAge, 5*time.Second, "lag shows the outage")
	failedDuring := metric(t, metrics, "outbox_failed_batches_total")
	require.Positive(t, failedDuring, "error metrics show the outage; relayer output:\n%s", p.out.String())
	require.Greater(t, metric(t, metrics, "outbox_oldest_pending_age_seconds"), 1.0, "lag gauge shows the outage")

	broker = start(t, "dev-kafka", "--listen", addr, "--partitions", "3", "--data", data)
	waitListening(t, addr)
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 180*time.Second, 100*time.Millisecond, "relayer did not resume; output:\n%s", p.out.String())
	require.Contains(t, p.out.String(), "backing off", "the outage is logged")

	for agg, ids := range second {
		first[agg] = append(first[agg], ids...)
	}
	got := readTopic(t, addr, "order", 4_000, 60*time.Second)
	dups := verify(t, first, got)
	t.Logf("outage of 10s: %v failed batches, %d records, %d duplicates", failedDuring, len(got), dups)
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))
	broker.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, broker.wait(t, 30*time.Second))
}

// Postgres connections of the relayer are terminated mid-run, again and
// again: the relayer reconnects and loses nothing.
func TestRelayerReconnectsAfterTerminatedConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	b, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	app := fmt.Sprintf("outbox_e2e_%d", rand.Int64()) // under 64 bytes, or the server truncates it
	p := start(t, relayArgs(db, b.Addr(), "--database-url", db.URL+"&application_name="+app, "--log-level", "info")...)
	// The terminations start once the relayer runs: a connection cut
	// while it starts (its schema check) ends the process, as any
	// start-up failure does, for its supervisor to restart; this test is
	// about the relayer running.
	require.Eventually(t, func() bool { return strings.Contains(p.out.String(), "relay started") }, 60*time.Second, 20*time.Millisecond,
		"the relayer never started; output:\n%s", p.out.String())

	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, ctx, db, 10_000, 100, 2, 20, 4*time.Second) }()
	terminated := 0
	for range 8 {
		time.Sleep(400 * time.Millisecond)
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) t", app).Scan(&n))
		terminated += n
	}
	committed := <-done
	require.Positive(t, terminated, "the relayer's connections were found and terminated; output:\n%s", p.out.String())
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 180*time.Second, 100*time.Millisecond, "relayer did not recover; output:\n%s", p.out.String())
	got := readTopic(t, b.Addr(), "order", 10_000, 60*time.Second)
	dups := verify(t, committed, got)
	t.Logf("%d connections terminated: %d records, %d duplicates", terminated, len(got), dups)
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))
}
