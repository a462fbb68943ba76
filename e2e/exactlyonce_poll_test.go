package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/sqltext"
	"github.com/pgoutbox/outbox/internal/tmppg"
)

// eosArgs turn exactly-once on, with a lease short enough that a killed
// relayer's batch is adopted within seconds.
var eosArgs = []string{"--exactly-once", "--lane-lease", "3s"}

// lanesIdent is the polling relay's lanes table of db's outbox.
func lanesIdent(db *pgtest.DB) string {
	tb := db.Tables.WithDefaults()
	return sqltext.For(tb.Schema, tb.Outbox, tb.Processed).Lanes
}

// settled reports whether nothing is pending and no lane has a batch in
// flight (a killed relayer's reservation waits for adoption: its rows are
// marked dispatched, but they may not be in Kafka yet).
func settled(t *testing.T, db *pgtest.DB) bool {
	t.Helper()
	if pending(t, db) > 0 {
		return false
	}
	var open int
	err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+lanesIdent(db)+" WHERE ids IS NOT NULL").Scan(&open)
	return err == nil && open == 0
}

// mergeCommitted adds more's ids to all's.
func mergeCommitted(all, more map[uuid.UUID][]int64) {
	for agg, ids := range more {
		all[agg] = append(all[agg], ids...)
	}
}

// killRun relays a load of events with two relayer replicas, killing
// one of them at random ten times (kill -9, then restarting it), and
// returns what was committed, the broker and how long the drain took.
func killRun(t *testing.T, exactly bool, events int) (map[uuid.UUID][]int64, *devkafka.Broker, time.Duration) {
	t.Helper()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	b, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	var extra []string
	if exactly {
		extra = eosArgs
	}
	began := time.Now()
	done := make(chan map[uuid.UUID][]int64, 1)
	// Spread over 10 s, so that the kills land while batches are in flight.
	go func() { done <- writers(t, ctx, db, events, 300, 4, 50, time.Duration(events/3)*time.Millisecond) }()
	procs := []*proc{start(t, relayArgs(db, b.Addr(), extra...)...), start(t, relayArgs(db, b.Addr(), extra...)...)}
	produced := produceSignal(b)
	for range 10 {
		time.Sleep(time.Duration(150+rand.IntN(600)) * time.Millisecond)
		i := rand.IntN(2)
		killSoonAfterAProduce(produced)
		procs[i].signal(t, syscall.SIGKILL)
		procs[i].wait(t, 10*time.Second)
		procs[i] = start(t, relayArgs(db, b.Addr(), extra...)...)
	}
	committed := <-done
	require.Eventually(t, func() bool { return settled(t, db) }, 180*time.Second, 100*time.Millisecond,
		"outbox did not drain; relayer output:\n%s\n%s", procs[0].out.String(), procs[1].out.String())
	took := time.Since(began)
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())
	}
	return committed, b, took
}

// Ten kill -9 of one of two relayer replicas during a 30,000-event load,
// with --exactly-once: readers of committed data that are not ours (kcat
// and Python's confluent-kafka, isolation.level=read_committed) read each
// event exactly once, in order per aggregate. The same run without
// --exactly-once shows the duplicates it prevents.
func TestExactlyOnceSurvivesTenSIGKILLs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("two runs of 30,000 events with ten process kills each; skipped with -short")
	}
	committed, b, took := killRun(t, true, 30_000)
	for name, read := range map[string]func(*testing.T, string, string, int, time.Duration) []delivered{
		"kcat": readCommittedKcat, "python": readCommittedPython,
	} {
		got := read(t, b.Addr(), "order", 30_000, 120*time.Second)
		lost, dups := exactlyOnce(t, committed, got)
		t.Logf("--exactly-once, 30,000 events, 10 SIGKILLs, 2 replicas, read by %s: %d records, %d lost, %d duplicates (drained in %s)",
			name, len(got), lost, dups, took.Round(time.Millisecond))
	}

	// The comparison, on half the load: what the same kills do without.
	plain, pb, plainTook := killRun(t, false, 15_000)
	got := readTopic(t, pb.Addr(), "order", 15_000, 120*time.Second)
	dups := verify(t, plain, got)
	t.Logf("without --exactly-once, 15,000 events, the same kills: %d records, %d duplicates (drained in %s)", len(got), dups, plainTook.Round(time.Millisecond))
}

// Postgres is killed (SIGKILL of the postmaster and its processes) three
// times while two exactly-once relayers drain a load, and restarted
// through crash recovery each time: every event is read once by readers
// of committed data. The same run without the flag shows what it
// prevents: the batches published whose marks the crashes lost.
func TestExactlyOncePostgresKilledThreeTimes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("three kills of a throwaway Postgres, twice; skipped with -short")
	}
	if !tmppg.Available() {
		t.Skip("needs initdb and pg_ctl for a throwaway cluster")
	}
	t.Run("exactly-once", func(t *testing.T) {
		t.Parallel()
		committed, b := postgresKilledRun(t, eosArgs)
		for name, read := range map[string]func(*testing.T, string, string, int, time.Duration) []delivered{
			"kcat": readCommittedKcat, "python": readCommittedPython,
		} {
			got := read(t, b.Addr(), "order", 15_000, 120*time.Second)
			lost, dups := exactlyOnce(t, committed, got)
			t.Logf("Postgres killed 3 times, read by %s: %d records, %d lost, %d duplicates", name, len(got), lost, dups)
		}
	})
	t.Run("at-least-once", func(t *testing.T) {
		t.Parallel()
		committed, b := postgresKilledRun(t, nil)
		got := readTopic(t, b.Addr(), "order", 15_000, 120*time.Second)
		dups := verify(t, committed, got)
		t.Logf("without --exactly-once, Postgres killed 3 times: %d records, 0 lost, %d duplicates", len(got), dups)
	})
}

// postgresKilledRun runs two relayers with extra on a throwaway cluster
// while writers emit 15,000 events and the cluster is killed three times,
// and returns the committed events once every one was settled.
func postgresKilledRun(t *testing.T, extra []string) (map[uuid.UUID][]int64, *devkafka.Broker) {
	ctx := context.Background()
	c, err := tmppg.Start(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	db := pgtest.New(t, pgtest.Options{MaxConns: 12, ServerURL: c.URL()})
	b, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	procs := []*proc{start(t, relayArgs(db, b.Addr(), extra...)...), start(t, relayArgs(db, b.Addr(), extra...)...)}

	committed := map[uuid.UUID][]int64{}
	for range 3 {
		mergeCommitted(committed, writers(t, ctx, db, 4_000, 100, 2, 50, time.Second))
		time.Sleep(time.Duration(50+rand.IntN(300)) * time.Millisecond)
		require.NoError(t, c.Kill())
		time.Sleep(time.Second)
		require.NoError(t, c.Up(ctx))
	}
	mergeCommitted(committed, writers(t, ctx, db, 3_000, 100, 2, 50, time.Second))
	require.Eventually(t, func() bool { return settled(t, db) }, 120*time.Second, 100*time.Millisecond,
		"outbox did not drain; relayer output:\n%s\n%s", procs[0].out.String(), procs[1].out.String())
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t, 30*time.Second))
	}
	return committed, b
}

// A relayer paused (SIGSTOP) with a batch in flight: after its lease the
// other relayer adopts its lane, which fences it and returns the batch to
// pending; resumed (SIGCONT), the paused one's commit or lease check fails,
// nothing it sent becomes visible, and it steps down, logging it.
func TestExactlyOnceFencedZombie(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits out a lane's lease; skipped with -short")
	}
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	b, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	zombie := start(t, relayArgs(db, b.Addr(), eosArgs...)...)
	other := start(t, relayArgs(db, b.Addr(), eosArgs...)...)
	committed := writers(t, ctx, db, 3_000, 100, 2, 50, time.Second)
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, ctx, db, 12_000, 100, 2, 50, 20*time.Second) }()

	zombiePID := fmt.Sprint(zombie.cmd.Process.Pid)
	inFlight := func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+lanesIdent(db)+" WHERE owner LIKE '%/' || $1 AND ids IS NOT NULL", zombiePID).Scan(&n))
		return n > 0
	}
	caught := false
	for range 400 {
		zombie.signal(t, syscall.SIGSTOP)
		// A statement the relayer sent just before it stopped still runs
		// (it may clear the reservation): look once the server is done.
		time.Sleep(100 * time.Millisecond)
		if caught = inFlight(); caught {
			break
		}
		zombie.signal(t, syscall.SIGCONT)
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	}
	require.True(t, caught, "never caught the relayer with a batch in flight")
	adopted := func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+lanesIdent(db)+" WHERE owner LIKE '%/' || $1", zombiePID).Scan(&n))
		return n == 0
	}
	require.Eventually(t, adopted, 60*time.Second, 100*time.Millisecond,
		"the other relayer should adopt the paused one's lane after its lease; output:\n%s", other.out.String())
	zombie.signal(t, syscall.SIGCONT)
	require.Eventually(t, func() bool { return strings.Contains(zombie.out.String(), "relay stepping down") }, 60*time.Second, 100*time.Millisecond,
		"the resumed relayer should step down; output:\n%s", zombie.out.String())

	mergeCommitted(committed, <-done)
	require.Eventually(t, func() bool { return settled(t, db) }, 120*time.Second, 100*time.Millisecond)
	for _, p := range []*proc{zombie, other} {
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t, 30*time.Second))
	}
	for name, read := range map[string]func(*testing.T, string, string, int, time.Duration) []delivered{
		"kcat": readCommittedKcat, "python": readCommittedPython,
	} {
		got := read(t, b.Addr(), "order", 15_000, 120*time.Second)
		lost, dups := exactlyOnce(t, committed, got)
		t.Logf("fenced zombie, read by %s: %d records, %d lost, %d duplicates", name, len(got), lost, dups)
	}
}

// produceSignal returns a channel that receives (without blocking the
// broker) each time a produce request of the outbox's topic reaches b.
func produceSignal(b *devkafka.Broker) <-chan struct{} {
	ch := make(chan struct{}, 1)
	b.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "order", Count: -1, When: func(kmsg.Request) bool {
		select {
		case ch <- struct{}{}:
		default:
		}
		return false // observe only
	}})
	return ch
}

// killSoonAfterAProduce waits (up to 2 s) for the next produce request to
// reach the broker, then 0-1 ms more: a kill then lands, often, after the
// broker acknowledged a batch and before the relayer recorded it, where
// at-least-once sends the batch again.
func killSoonAfterAProduce(produced <-chan struct{}) {
	select {
	case <-produced: // drop a stale signal
	default:
	}
	select {
	case <-produced:
		time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
	case <-time.After(2 * time.Second):
	}
}
