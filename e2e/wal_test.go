package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
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

// logical is the package's throwaway cluster with wal_level=logical (the
// machine's server has replica), started by the first test that needs it
// and stopped by TestMain.
var logical struct {
	once sync.Once
	c    *tmppg.Cluster
	err  error
}

// needLogical skips (fails in CI) when no wal_level=logical cluster could
// be started, and returns its URL.
func needLogical(t *testing.T) string {
	t.Helper()
	logical.once.Do(func() {
		if !tmppg.Available() {
			logical.err = errors.New("initdb and pg_ctl are not on the PATH")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		logical.c, logical.err = tmppg.Logical(ctx, 20, map[string]string{"max_connections": "150"})
	})
	if logical.err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the WAL relay's process tests need a throwaway cluster with wal_level=logical, and none started: %v", logical.err)
		}
		t.Skipf("skipped: the WAL relay's process tests need a throwaway cluster with wal_level=logical (initdb/pg_ctl), and none started: %v", logical.err)
	}
	return logical.c.URL()
}

func stopLogical() {
	if logical.c != nil {
		_ = logical.c.Stop()
	}
}

// walBundle is one WAL test's outbox (on the logical cluster), broker and
// slot name.
type walBundle struct {
	db     *pgtest.DB
	broker *devkafka.Broker
	slot   string
}

func walSetup(t *testing.T) *walBundle {
	t.Helper()
	url := needLogical(t)
	db := pgtest.New(t, pgtest.Options{MaxConns: 12, ServerURL: url})
	b, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	t.Cleanup(func() {
		// The relayer processes are killed by now (cleanups run in
		// reverse); their walsenders may take a moment to go.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			if err := walrelay.Teardown(ctx, db.Pool, slot, slot); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("teardown of slot %s failed", slot)
	})
	return &walBundle{db: db, broker: b, slot: slot}
}

// walArgs are the arguments of a `outbox relay --mode wal` process whose
// records carry event_source = source. The heartbeat is short so that the
// slot's position passes the last event soon after it is published.
func (w *walBundle) walArgs(source string, extra ...string) []string {
	return relayArgs(w.db, w.broker.Addr(), append([]string{"--mode", "wal", "--source", source, "--heartbeat-interval", "500ms"}, extra...)...)
}

// slotState reads the slot from pg_replication_slots (shared memory, not
// MVCC: a transaction sees it move).
type slotState struct {
	exists, active bool
	confirmed      int64 // confirmed_flush_lsn as a number
}

func readSlot(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, slot string) slotState {
	t.Helper()
	var (
		s         slotState
		confirmed *int64 // NULL while the slot is being created
	)
	err := q.QueryRow(context.Background(), `SELECT active, (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s.active, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return s
	}
	require.NoError(t, err)
	s.exists = true
	if confirmed != nil {
		s.confirmed = *confirmed
	}
	return s
}

// streaming reports whether a relayer reads the slot. The slot is also
// active while pg_create_logical_replication_slot looks for its
// consistent point, before which commits are not in it; its
// confirmed_flush_lsn is NULL until that point is found.
func (s slotState) streaming() bool { return s.active && s.confirmed > 0 }

// waitStreaming waits until a relayer streams the slot: from then on every
// commit is in it.
func (w *walBundle) waitStreaming(t *testing.T, relayer *proc) {
	t.Helper()
	require.Eventually(t, func() bool { return readSlot(t, w.db.Pool, w.slot).streaming() }, 30*time.Second, 20*time.Millisecond,
		"the first relayer never streamed; output:\n%s", relayer.out.String())
}

// walDrained waits until the slot is confirmed past lsn: the broker has
// acknowledged every event committed before it.
func (w *walBundle) walDrained(t *testing.T, lsn int64, relayer *proc) {
	t.Helper()
	require.Eventually(t, func() bool { return readSlot(t, w.db.Pool, w.slot).confirmed >= lsn },
		120*time.Second, 50*time.Millisecond, "the slot never passed the last event; relayer output:\n%s", relayer.out.String())
}

// load is what produce committed.
type load struct {
	committed map[uuid.UUID][]int64 // ids by aggregate, for verify
	// lsn is, per event, the server's WAL insert position read just after
	// its transaction committed: at or past the commit record's end, the
	// position the slot confirms once the broker has the transaction.
	lsn    map[int64]int64
	last   int64 // the greatest lsn
	events int
	plain  int // of events, written by plain INSERT
	ended  time.Time
}

// plainInsertSQL is a producer that does not use Emit: a multi-row INSERT
// (one transaction), checked by the table's insert guard (migration 6).
const plainInsertSQL = `INSERT INTO %s (aggregate_id, type, payload, headers)
SELECT a, 'order.paid', jsonb_build_object('n', n), '{"writer": "plain-sql"}'
FROM unnest($1::uuid[]) WITH ORDINALITY AS u(a, n)
RETURNING id, aggregate_id::text`

// produce writes events in transactions of 50 from five goroutines at
// once: three with outbox.EmitBatch over 300 shared aggregates (Emit's
// aggregate lock orders their commits), two with plain INSERTs, each over
// 100 aggregates of its own (a plain INSERT takes no aggregate lock, so an
// aggregate it writes has one writer, whose commits come in id order). Each
// goroutine sleeps pause between transactions. It stops after about events
// events, or when stop closes (nil: never).
func produce(t *testing.T, db *pgtest.DB, events int, pause time.Duration, stop <-chan struct{}) *load {
	t.Helper()
	ctx := context.Background()
	const batch, emitters, inserters = 50, 3, 2
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	shared := newAggregates(300)
	insertSQL := fmt.Sprintf(plainInsertSQL, db.Tables.OutboxIdent())
	l := &load{committed: map[uuid.UUID][]int64{}, lsn: map[int64]int64{}}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	record := func(aggs []uuid.UUID, ids []int64, plain bool) bool {
		var lsn int64
		if err := db.Pool.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&lsn); err != nil {
			t.Errorf("read the WAL position: %v", err)
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		for i, id := range ids {
			l.committed[aggs[i]] = append(l.committed[aggs[i]], id)
			l.lsn[id] = lsn
		}
		l.last = max(l.last, lsn)
		l.events += len(ids)
		if plain {
			l.plain += len(ids)
		}
		return true
	}
	txs := events / batch
	for g := range emitters + inserters {
		own := newAggregates(100)
		wg.Go(func() {
			for i := g; i < txs; i += emitters + inserters {
				select {
				case <-stop:
					return
				default:
				}
				var (
					aggs []uuid.UUID
					ids  []int64
				)
				if g < emitters {
					evs := make([]outbox.Event, batch)
					for j := range evs {
						evs[j] = outbox.Event{AggregateID: shared[rand.IntN(len(shared))], Type: "order.placed", Payload: map[string]int{"tx": i, "n": j}}
						aggs = append(aggs, evs[j].AggregateID)
					}
					err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
						var err error
						ids, err = p.EmitBatch(ctx, tx, evs)
						return err
					})
					if err != nil {
						t.Errorf("emit: %v", err)
						return
					}
				} else {
					keys := make([]string, batch)
					for j := range keys {
						keys[j] = own[rand.IntN(len(own))].String()
					}
					rows, err := db.Pool.Query(ctx, insertSQL, keys)
					if err == nil {
						var (
							id  int64
							agg string
						)
						_, err = pgx.ForEachRow(rows, []any{&id, &agg}, func() error {
							ids = append(ids, id)
							aggs = append(aggs, uuid.MustParse(agg))
							return nil
						})
					}
					if err != nil {
						t.Errorf("plain insert: %v", err)
						return
					}
				}
				if !record(aggs, ids, g >= emitters) {
					return
				}
				time.Sleep(pause)
			}
		})
	}
	wg.Wait()
	l.ended = time.Now()
	return l
}

func newAggregates(n int) []uuid.UUID {
	out := make([]uuid.UUID, n)
	for i := range out {
		out[i] = uuid.New()
	}
	return out
}

// kill is one SIGKILL of a WAL relayer: when its process was gone, and the
// slot's confirmed position once its walsender was gone too, where the
// next relayer starts.
type kill struct {
	at        time.Time
	confirmed int64
	streaming bool // the slot was being read when the kill came
}

// resendBound is how many duplicates the kills may cause: per kill, the
// events already in Kafka whose transactions the slot had not confirmed
// (the unacknowledged), which the next relayer sends again.
func resendBound(got []delivered, l *load, kills []kill) int {
	first := map[int64]time.Time{}
	for _, d := range got {
		if at, ok := first[d.id]; !ok || d.at.Before(at) {
			first[d.id] = d.at
		}
	}
	n := 0
	for _, k := range kills {
		for id, at := range first {
			if at.Before(k.at) && l.lsn[id] > k.confirmed {
				n++
			}
		}
	}
	return n
}

// SIGKILL the `outbox relay --mode wal` process at random moments, ten
// times, during a 50,000-event run (Emit and plain INSERT producers),
// starting a new process after each kill: every committed event is in
// Kafka, the first deliveries of each aggregate come in id order, and the
// duplicates are at most the events the slot had not confirmed at each
// kill.
func TestWALRelayerSurvivesTenSIGKILLs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("50,000 events and ten process kills; skipped with -short")
	}
	began := time.Now()
	w := walSetup(t)
	p := start(t, w.walArgs("wal", "--log-level", "info")...)
	// The slot holds what is committed after it exists: write once the
	// first relayer has created it and streams.
	w.waitStreaming(t, p)
	done := make(chan *load, 1)
	go func() { done <- produce(t, w.db, 50_000, 25*time.Millisecond, nil) }()

	var kills []kill
	outputs := []*syncBuffer{p.out}
	for range 10 {
		time.Sleep(time.Duration(250+rand.IntN(500)) * time.Millisecond)
		streaming := readSlot(t, w.db.Pool, w.slot).streaming()
		p.signal(t, syscall.SIGKILL)
		p.wait(t, 10*time.Second)
		at := time.Now()
		// Once the killed relayer's walsender is gone the slot's position
		// is final, and the next relayer finds the slot free.
		var s slotState
		require.Eventually(t, func() bool { s = readSlot(t, w.db.Pool, w.slot); return !s.active }, 10*time.Second, 5*time.Millisecond,
			"the killed relayer's walsender never let go of the slot")
		kills = append(kills, kill{at: at, confirmed: s.confirmed, streaming: streaming})
		p = start(t, w.walArgs("wal", "--log-level", "info")...)
		outputs = append(outputs, p.out)
	}
	l := <-done
	w.walDrained(t, l.last, p)
	// The killed relayer may have confirmed the last event already: wait
	// until the new one holds the slot, so that SIGTERM reaches a process
	// that handles it rather than one still starting.
	require.Eventually(t, func() bool { return readSlot(t, w.db.Pool, w.slot).active }, 30*time.Second, 10*time.Millisecond,
		"the last relayer never took the slot; output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())

	got := readTopic(t, w.broker.Addr(), "order", l.events, 60*time.Second)
	explainLoss(t, w, l, got, kills, outputs)
	dups := verify(t, l.committed, got)
	bound := resendBound(got, l, kills)
	streamed := 0
	for _, k := range kills {
		if k.streaming {
			streamed++
		}
	}
	t.Logf("wal, %d events (%d by plain INSERT), 10 SIGKILLs (%d while streaming): %d records, 0 lost, 0 order violations, %d duplicates (bound: %d unconfirmed at the kills); %s",
		l.events, l.plain, streamed, len(got), dups, bound, time.Since(began).Round(100*time.Millisecond))
	require.LessOrEqual(t, dups, bound, "duplicates are at most the events the slot had not confirmed at each kill")
}

// Two `outbox relay --mode wal` processes on one slot; the leader is
// killed with SIGKILL mid-run and the standby takes over: nothing lost,
// order kept, and the standby published nothing while the leader lived.
// The takeover time is from the kill to the standby's first record.
func TestWALFailoverToStandbyProcess(t *testing.T) {
	t.Parallel()
	began := time.Now()
	w := walSetup(t)
	leader := start(t, w.walArgs("wal-a", "--log-level", "info")...)
	w.waitStreaming(t, leader)
	standby := start(t, w.walArgs("wal-b", "--log-level", "info")...)
	require.Eventually(t, func() bool { return strings.Contains(standby.out.String(), "waiting to lead") }, 30*time.Second, 20*time.Millisecond,
		"the standby never started; output:\n%s", standby.out.String())

	done := make(chan *load, 1)
	go func() { done <- produce(t, w.db, 20_000, 50*time.Millisecond, nil) }()
	time.Sleep(1500 * time.Millisecond)
	killed := time.Now()
	leader.signal(t, syscall.SIGKILL)
	leader.wait(t, 10*time.Second)
	l := <-done
	require.True(t, l.ended.After(killed), "the producers were still writing when the leader died")
	w.walDrained(t, l.last, standby)
	standby.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, standby.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", standby.out.String())

	got := readTopic(t, w.broker.Addr(), "order", l.events, 60*time.Second)
	explainLoss(t, w, l, got, nil, []*syncBuffer{leader.out, standby.out})
	dups := verify(t, l.committed, got)
	var first time.Time
	by := map[string]int{}
	for _, d := range got {
		by[d.source]++
		if d.source == "wal-b" && (first.IsZero() || d.at.Before(first)) {
			first = d.at
		}
	}
	require.Positive(t, by["wal-a"], "the leader published before it died")
	require.Positive(t, by["wal-b"], "the standby took over; its output:\n%s", standby.out.String())
	require.True(t, first.After(killed), "the standby published nothing while the leader lived")
	takeover := first.Sub(killed)
	t.Logf("wal failover, %d events (%d by plain INSERT): leader killed, standby's first record %s later; %d records (leader %d, standby %d), 0 lost, 0 order violations, %d duplicates; %s",
		l.events, l.plain, takeover.Round(time.Millisecond), len(got), by["wal-a"], by["wal-b"], dups, time.Since(began).Round(100*time.Millisecond))
	require.Less(t, takeover, 15*time.Second, "takeover within the leader poll interval plus the slot's release")
}

// switchReport runs `outbox switch <direction> --json` on the test's
// outbox, as an operator would, and returns its report; the test fails
// unless it exits 0 (it gives up itself after timeout, saying why). The
// command's log (progress, and which database it connected to) goes to
// the test's log.
func (w *walBundle) switchReport(t *testing.T, direction string, timeout time.Duration) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, "switch", direction, "--database-url", w.db.URL, "--schema", w.db.Tables.Schema,
		"--timeout", timeout.String(), "--json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "KAFKA_BROKERS=")
	err := cmd.Run()
	t.Logf("outbox switch %s: %s", direction, strings.TrimSpace(stderr.String()))
	require.NoError(t, err, "outbox switch %s; stdout:\n%s\nstderr:\n%s", direction, stdout.String(), stderr.String())
	var rep map[string]any
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), "outbox switch %s --json: %s", direction, stdout.String())
	return rep
}

// Switching from the polling relay to the WAL source and back, with
// producers writing throughout, by the procedure of docs/wal.md: `outbox switch
// to-wal` and `outbox switch to-poll` do the database's steps and the
// test stops and starts the relayers between them. Every event arrives,
// first deliveries keep per-aggregate order, and the duplicates are
// counted by the switch that made them.
func TestSwitchPollToWALAndBackLosesNothing(t *testing.T) {
	t.Parallel()
	began := time.Now()
	w := walSetup(t)
	poll1 := start(t, relayArgs(w.db, w.broker.Addr(), "--source", "poll-1")...)
	stop := make(chan struct{})
	done := make(chan *load, 1)
	go func() { done <- produce(t, w.db, 1_000_000, 40*time.Millisecond, stop) }()
	time.Sleep(time.Second)

	// Poll -> WAL: the command creates the slot and waits until the
	// polling relayer has dispatched everything up to the cut.
	switched := time.Now()
	toWAL := w.switchReport(t, "to-wal", 60*time.Second)
	require.Equal(t, w.slot, toWAL["slot"])
	require.Equal(t, true, toWAL["slot_created"])
	poll1.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, poll1.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", poll1.out.String())
	wal := start(t, w.walArgs("wal")...)
	pollToWAL := time.Since(switched)
	time.Sleep(1500 * time.Millisecond)

	// WAL -> poll: the command marks what the slot confirmed, while the
	// WAL relayer runs.
	switched = time.Now()
	toPoll := w.switchReport(t, "to-poll", 60*time.Second)
	require.Equal(t, w.slot, toPoll["slot"])
	wal.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, wal.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", wal.out.String())
	td := start(t, w.walArgs("wal", "--teardown")...)
	require.Equal(t, 0, td.wait(t, 30*time.Second), "teardown; output:\n%s", td.out.String())
	require.False(t, readSlot(t, w.db.Pool, w.slot).exists, "the slot is dropped")
	poll2 := start(t, relayArgs(w.db, w.broker.Addr(), "--source", "poll-2")...)
	walToPoll := time.Since(switched)

	time.Sleep(time.Second)
	close(stop)
	l := <-done
	require.Eventually(t, func() bool { return pending(t, w.db) == 0 }, 60*time.Second, 50*time.Millisecond,
		"the polling relay did not drain; output:\n%s", poll2.out.String())
	poll2.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, poll2.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", poll2.out.String())

	got := readTopic(t, w.broker.Addr(), "order", l.events, 60*time.Second)
	explainLoss(t, w, l, got, nil, []*syncBuffer{poll1.out, wal.out, poll2.out})
	dups := verify(t, l.committed, got)
	firstBy := map[int64]string{}
	by, dupBy := map[string]int{}, map[string]int{}
	for _, d := range got {
		by[d.source]++
		if f, ok := firstBy[d.id]; ok {
			dupBy[f+" then "+d.source]++
			continue
		}
		firstBy[d.id] = d.source
	}
	for _, s := range []string{"poll-1", "wal", "poll-2"} {
		require.Positive(t, by[s], "%s published events", s)
	}
	seconds := func(rep map[string]any, key string) time.Duration {
		return time.Duration(rep[key].(float64) * float64(time.Second)).Round(time.Millisecond)
	}
	count := func(rep map[string]any, key string) int64 { return int64(rep[key].(float64)) }
	t.Logf("switch poll->wal->poll, %d events (%d by plain INSERT): %d records (poll-1 %d, wal %d, poll-2 %d), 0 lost, 0 order violations, %d duplicates (%v); "+
		"poll->wal took %s (to-wal waited %s for %d rows up to the cut), wal->poll %s (to-poll: relayer caught up in %s, marking transaction %s, %d rows marked dispatched); %s",
		l.events, l.plain, len(got), by["poll-1"], by["wal"], by["poll-2"], dups, dupBy,
		pollToWAL.Round(time.Millisecond), seconds(toWAL, "waited_seconds"), count(toWAL, "pending_at_cut"),
		walToPoll.Round(time.Millisecond), seconds(toPoll, "catch_up_seconds"), seconds(toPoll, "transaction_seconds"), count(toPoll, "marked"),
		time.Since(began).Round(100*time.Millisecond))
}

// explainLoss fails the test, saying what is known of them, when committed
// events never reached Kafka: their ids and WAL positions against the
// kills', the parked rows, and the relayers' output.
func explainLoss(t *testing.T, w *walBundle, l *load, got []delivered, kills []kill, outputs []*syncBuffer) {
	t.Helper()
	seen := map[int64]bool{}
	for _, d := range got {
		seen[d.id] = true
	}
	var lost []int64
	for _, ids := range l.committed {
		for _, id := range ids {
			if !seen[id] {
				lost = append(lost, id)
			}
		}
	}
	if len(lost) == 0 {
		return
	}
	slices.Sort(lost)
	byLSN := map[int64][]int64{}
	for _, id := range lost {
		byLSN[l.lsn[id]] = append(byLSN[l.lsn[id]], id)
	}
	var b strings.Builder
	for lsn, ids := range byLSN {
		fmt.Fprintf(&b, "  committed before WAL position %d: %d events, ids %d..%d\n", lsn, len(ids), ids[0], ids[len(ids)-1])
	}
	for i, k := range kills {
		fmt.Fprintf(&b, "  kill %d at %s: slot confirmed %d, streaming %v\n", i+1, k.at.Format("15:04:05.000"), k.confirmed, k.streaming)
	}
	var parked int
	require.NoError(t, w.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{w.db.Tables.Schema, w.db.Tables.Outbox + "_parked"}.Sanitize()).Scan(&parked))
	fmt.Fprintf(&b, "  parked rows: %d\n", parked)
	for i, o := range outputs {
		fmt.Fprintf(&b, "--- relayer %d:\n%s", i, o.String())
	}
	t.Fatalf("%d of %d committed events never reached Kafka:\n%s", len(lost), l.events, b.String())
}
