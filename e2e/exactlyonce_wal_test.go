package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// privateWAL is walSetup on a wal_level=logical cluster of the test's own
// (with the extra settings), for a test that crashes or slows the server.
func privateWAL(t *testing.T, extra map[string]string) (*walBundle, *tmppg.Cluster) {
	t.Helper()
	needLogical(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := tmppg.Logical(ctx, 6, extra)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	db := pgtest.New(t, pgtest.Options{MaxConns: 12, ServerURL: c.URL()})
	b, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return &walBundle{db: db, broker: b, slot: walrelay.DefaultNameOf(db.Pool, db.Tables)}, c
}

// eoArgs are walArgs with --exactly-once (when eo) and info logs, which
// say when a relayer leads and steps down.
func (w *walBundle) eoArgs(source string, eo bool) []string {
	extra := []string{"--log-level", "info"}
	if eo {
		extra = append(extra, "--exactly-once", "--transaction-timeout", "5s")
	}
	return w.walArgs(source, extra...)
}

// leading is the process of ps that leads now: it said it streams the
// slot and has not stepped down since. -1 when none does.
func leading(ps []*proc) int {
	for i, p := range ps {
		out := p.out.String()
		if l := strings.LastIndex(out, "leads: streaming"); l >= 0 && l > strings.LastIndex(out, "stepped down") {
			return i
		}
	}
	return -1
}

// killLeaderTenTimes runs two relayer processes (leader and standby) over
// a 30,000-event load and kills the one that leads with SIGKILL ten times,
// starting it again each time. It returns the load and the processes'
// outputs, once the slot is past the last event.
func killLeaderTenTimes(t *testing.T, w *walBundle, eo bool) (*load, []*syncBuffer) {
	t.Helper()
	ps := []*proc{start(t, w.eoArgs("wal-0", eo)...)}
	w.waitStreaming(t, ps[0])
	ps = append(ps, start(t, w.eoArgs("wal-1", eo)...))
	outputs := []*syncBuffer{ps[0].out, ps[1].out}
	done := make(chan *load, 1)
	go func() { done <- produce(t, w.db, 30_000, 60*time.Millisecond, nil) }()
	for k := range 10 {
		time.Sleep(time.Duration(300+rand.IntN(600)) * time.Millisecond)
		var i int
		require.Eventually(t, func() bool { i = leading(ps); return i >= 0 && readSlot(t, w.db.Pool, w.slot).active }, 30*time.Second, 10*time.Millisecond,
			"no relayer leads before kill %d; outputs:\n%s\n---\n%s", k+1, ps[0].out.String(), ps[1].out.String())
		ps[i].signal(t, syscall.SIGKILL)
		ps[i].wait(t, 10*time.Second)
		ps[i] = start(t, w.eoArgs(fmt.Sprintf("wal-%d", i), eo)...)
		outputs = append(outputs, ps[i].out)
	}
	l := <-done
	w.walDrained(t, l.last, ps[0])
	for _, p := range ps {
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())
	}
	return l, outputs
}

// Ten SIGKILLs of the leading `outbox relay --mode wal --exactly-once`
// process, with a standby beside it, during a 30,000-event load: kcat and
// Python's confluent-kafka, reading read_committed, see every event
// exactly once, in per-aggregate order. The same run without
// --exactly-once shows the duplicates it prevents.
func TestWALExactlyOnceSurvivesTenSIGKILLs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("30,000 events and ten process kills, twice; skipped with -short")
	}
	t.Run("exactly-once", func(t *testing.T) {
		t.Parallel()
		began := time.Now()
		w := walSetup(t)
		l, outputs := killLeaderTenTimes(t, w, true)
		for name, read := range map[string]func(*testing.T, string, string, int, time.Duration) []delivered{
			"kcat": readCommittedKcat, "python": readCommittedPython,
		} {
			got := read(t, w.broker.Addr(), "order", l.events, 90*time.Second)
			explainLoss(t, w, l, got, nil, outputs)
			lost, dups := exactlyOnce(t, l.committed, got)
			t.Logf("wal --exactly-once, %d events, 2 replicas, 10 SIGKILLs of the leader, read by %s (read_committed): %d records, %d lost, %d duplicates; %s",
				l.events, name, len(got), lost, dups, time.Since(began).Round(100*time.Millisecond))
		}
		skipped := 0
		for _, o := range outputs {
			skipped += strings.Count(o.String(), "caught up with the lane's progress")
		}
		t.Logf("leads that found the slot behind the lane's progress and skipped: %d", skipped)
	})
	t.Run("at-least-once", func(t *testing.T) {
		t.Parallel()
		w := walSetup(t)
		l, outputs := killLeaderTenTimes(t, w, false)
		got := readTopic(t, w.broker.Addr(), "order", l.events, 90*time.Second)
		explainLoss(t, w, l, got, nil, outputs)
		dups := verify(t, l.committed, got)
		t.Logf("wal without --exactly-once, the same run: %d events, %d records, 0 lost, %d duplicates", l.events, len(got), dups)
	})
}

// outageLoad emits events in transactions of 20 from three goroutines
// until stop closes, riding out a server that goes away (a failed
// transaction is tried again later; one whose commit's outcome is unknown
// is found in the table afterwards).
func outageLoad(t *testing.T, db *pgtest.DB, stop <-chan struct{}) {
	t.Helper()
	ctx := context.Background()
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	aggs := newAggregates(200)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				evs := make([]outbox.Event, 20)
				for j := range evs {
					evs[j] = outbox.Event{AggregateID: aggs[rand.IntN(len(aggs))], Type: "order.placed", Payload: map[string]int{"n": j}}
				}
				_ = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					_, err := p.EmitBatch(ctx, tx, evs)
					return err
				})
			}
		})
	}
	wg.Wait()
}

// committedRows reads what the outbox holds: every event committed (the
// WAL source leaves the rows).
func committedRows(t *testing.T, db *pgtest.DB) (map[uuid.UUID][]int64, int) {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), "SELECT id, aggregate_id FROM "+db.Tables.OutboxIdent()+" ORDER BY id")
	require.NoError(t, err)
	out := map[uuid.UUID][]int64{}
	n := 0
	var (
		id  int64
		agg uuid.UUID
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &agg}, func() error {
		out[agg] = append(out[agg], id)
		n++
		return nil
	})
	require.NoError(t, err)
	return out, n
}

// Postgres killed with SIGKILL three times under load, each time brought
// back through crash recovery (the slot's confirmed position may go back
// to the last checkpoint): a read_committed reader sees every committed
// event exactly once. Without the flag, the same run shows the events
// the slot's step back sends again.
func TestWALExactlyOncePostgresKilledThreeTimes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("three Postgres crashes under load, twice; skipped with -short")
	}
	t.Run("exactly-once", func(t *testing.T) {
		t.Parallel()
		began := time.Now()
		w, out := walPostgresKilledRun(t, true)
		committed, n := committedRows(t, w.db)
		got := readCommittedKcat(t, w.broker.Addr(), "order", n, 60*time.Second)
		lost, dups := exactlyOnce(t, committed, got)
		t.Logf("wal --exactly-once, 3 Postgres SIGKILLs under load: %d events committed, %d records read (kcat, read_committed), %d lost, %d duplicates, %d leads skipped events read again; %s",
			n, len(got), lost, dups, strings.Count(out, "caught up with the lane's progress"), time.Since(began).Round(100*time.Millisecond))
	})
	t.Run("at-least-once", func(t *testing.T) {
		t.Parallel()
		w, _ := walPostgresKilledRun(t, false)
		committed, n := committedRows(t, w.db)
		got := readTopic(t, w.broker.Addr(), "order", n, 60*time.Second)
		dups := verify(t, committed, got)
		t.Logf("wal without --exactly-once, 3 Postgres SIGKILLs under load: %d events committed, %d records, 0 lost, %d duplicates", n, len(got), dups)
	})
}

// walPostgresKilledRun runs a WAL relayer (exactly-once or not) on a
// private cluster under load, kills the cluster three times, and returns
// once the relayer has taken in all the WAL and stopped, with its output.
func walPostgresKilledRun(t *testing.T, eo bool) (*walBundle, string) {
	w, c := privateWAL(t, nil)
	p := start(t, w.eoArgs("wal", eo)...)
	w.waitStreaming(t, p)
	stop := make(chan struct{})
	loaded := make(chan struct{})
	go func() { outageLoad(t, w.db, stop); close(loaded) }()
	ctx := context.Background()
	for range 3 {
		time.Sleep(time.Duration(1500+rand.IntN(1000)) * time.Millisecond)
		require.NoError(t, c.Kill())
		time.Sleep(500 * time.Millisecond)
		require.NoError(t, c.Up(ctx))
		require.Eventually(t, func() bool { return readSlot(t, w.db.Pool, w.slot).streaming() }, 60*time.Second, 50*time.Millisecond,
			"the relayer never streamed again; output:\n%s", p.out.String())
	}
	time.Sleep(time.Second)
	close(stop)
	<-loaded
	var last int64
	require.NoError(t, w.db.Pool.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&last))
	w.walDrained(t, last, p)
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())
	return w, p.out.String()
}

// A leader paused with SIGSTOP mid-load loses its session (here ended by
// the server, as a network cut would) and its stream (wal_sender_timeout);
// the standby takes over and opens the lane, which fences the paused one.
// Resumed with SIGCONT, the old leader publishes nothing that becomes
// visible and steps down; every event is visible once.
func TestWALExactlyOnceFencedZombie(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a paused leader and a takeover under load; skipped with -short")
	}
	w, _ := privateWAL(t, nil)
	zombie := start(t, w.eoArgs("wal-a", true)...)
	w.waitStreaming(t, zombie)
	standby := start(t, w.eoArgs("wal-b", true)...)
	require.Eventually(t, func() bool { return strings.Contains(standby.out.String(), "waiting to lead") }, 30*time.Second, 20*time.Millisecond)
	done := make(chan *load, 1)
	go func() { done <- produce(t, w.db, 10_000, 80*time.Millisecond, nil) }()
	time.Sleep(2 * time.Second)
	zombie.signal(t, syscall.SIGSTOP)
	paused := time.Now()
	// Nothing ends the paused leader's sessions but the relay's own
	// settings: its lock session lapses (idle_session_timeout), and the
	// new leader ends its stream.
	require.Eventually(t, func() bool { return strings.Contains(standby.out.String(), "leads: streaming") }, 60*time.Second, 50*time.Millisecond,
		"the standby never took over; output:\n%s", standby.out.String())
	zombie.signal(t, syscall.SIGCONT)
	require.Eventually(t, func() bool { return strings.Contains(zombie.out.String(), "stepped down") }, 30*time.Second, 50*time.Millisecond,
		"the resumed leader never stepped down; output:\n%s", zombie.out.String())
	l := <-done
	w.walDrained(t, l.last, standby)
	for _, p := range []*proc{standby, zombie} {
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())
	}
	for name, read := range map[string]func(*testing.T, string, string, int, time.Duration) []delivered{
		"kcat": readCommittedKcat, "python": readCommittedPython,
	} {
		got := read(t, w.broker.Addr(), "order", l.events, 60*time.Second)
		explainLoss(t, w, l, got, nil, []*syncBuffer{zombie.out, standby.out})
		lost, dups := exactlyOnce(t, l.committed, got)
		late := 0
		for _, d := range got {
			if d.source == "wal-a" && d.at.After(paused) {
				late++
			}
		}
		require.Zero(t, late, "records the paused leader sent after its pause are visible")
		t.Logf("fenced zombie, %d events, read by %s: %d records, %d lost, %d duplicates; the resumed leader said: %s",
			l.events, name, len(got), lost, dups, lastLine(zombie.out.String(), "stepped down"))
	}
}

// lastLine is the last line of out that contains s.
func lastLine(out, s string) string {
	i := strings.LastIndex(out, s)
	if i < 0 {
		return ""
	}
	start := strings.LastIndexByte(out[:i], '\n') + 1
	end := strings.IndexByte(out[i:], '\n')
	if end < 0 {
		return out[start:]
	}
	return out[start : i+end]
}
