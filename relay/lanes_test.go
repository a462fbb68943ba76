package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/testhook"
	"github.com/pgoutbox/outbox/internal/testlog"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// txPublisher builds a transactional publisher on the bundle's broker, as
// each relayer process has its own.
func (b *bundle) txPublisher(t *testing.T) *kafkapub.TxPublisher {
	t.Helper()
	cfg := kafka.ClientConfig{Brokers: []string{b.broker.Addr()}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}}
	client, err := kafkapub.NewPublisherClient(cfg)
	require.NoError(t, err)
	t.Cleanup(client.Close)
	tp, err := kafkapub.NewTxPublisher(client, kafkapub.PublisherConfig{}, kafkapub.TxConfig{Client: cfg, TransactionTimeout: 5 * time.Second})
	require.NoError(t, err)
	return tp
}

// eosRelayer is an exactly-once relayer with a short lease.
func (b *bundle) eosRelayer(t *testing.T, mod func(*relay.Config)) *relay.Relayer {
	t.Helper()
	return b.relayer(t, func(c *relay.Config) {
		c.Sink = b.txPublisher(t)
		c.ExactlyOnce = true
		c.LaneLease = 2 * time.Second
		if mod != nil {
			mod(c)
		}
	})
}

// readOnce reads topic with read_committed until want records came (and
// a quiet spell) and checks that each committed id arrived exactly once,
// in order per aggregate.
func (b *bundle) readOnce(t *testing.T, committed map[int64]uuid.UUID, topic string) []record {
	t.Helper()
	raw := kafkatest.ReadCommitted(t, b.broker.Addr(), 60*time.Second, kafkatest.AtLeastThenQuiet(len(committed), time.Second), topic)
	recs := make([]record, 0, len(raw))
	for _, r := range raw {
		recs = append(recs, record{Key: string(r.Key), Partition: r.Partition, Offset: r.Offset, EventID: kafkatest.EventID(r)})
	}
	require.Zero(t, checkDelivered(t, committed, recs), "a read_committed reader must see no duplicate")
	return recs
}

// lane is a row of the lanes table.
type laneRow struct {
	lane  int
	epoch int64
	seq   int64
	ids   []int64
}

func (b *bundle) lanes(t *testing.T) []laneRow {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), "SELECT lane, epoch, seq, coalesce(ids, '{}') FROM "+relay.LanesIdent(b.db.Tables)+" ORDER BY lane")
	require.NoError(t, err)
	defer rows.Close()
	var out []laneRow
	for rows.Next() {
		var l laneRow
		require.NoError(t, rows.Scan(&l.lane, &l.epoch, &l.seq, &l.ids))
		out = append(out, l)
	}
	require.NoError(t, rows.Err())
	return out
}

// Two exactly-once relayers drain a backlog on few aggregates: each holds
// a lane of its own, and a read_committed reader sees every event once,
// in order per aggregate; at the end no lane has a reservation open.
func TestLanesDeliverEachEventOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	committed := b.emitSpread(t, 3000, 20, "laneonce.placed")
	for range 2 {
		run(t, b.eosRelayer(t, func(c *relay.Config) { c.BatchSize = 200 }))
	}
	b.waitDrained(t, 60*time.Second)
	b.readOnce(t, committed, "laneonce")
	require.Eventually(t, func() bool {
		for _, l := range b.lanes(t) {
			if len(l.ids) > 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "a lane kept a reservation after its batch was published")
	require.GreaterOrEqual(t, len(b.lanes(t)), 2, "each relayer holds a lane of its own")
}

// A relayer that died with a batch in flight left its lane reserved (rows
// marked dispatched). The relayer that takes the lane next opens it, which
// fences the dead one, and decides by the progress the lane's last broker
// transaction recorded: published, the rows stay dispatched and are not
// sent again; not published, they return to pending and are sent once.
func TestLaneRecoveryByProgress(t *testing.T) {
	t.Parallel()
	for _, published := range []bool{true, false} {
		t.Run(fmt.Sprint("published=", published), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			topic := fmt.Sprintf("recover%v", published)
			committed := b.emitSpread(t, 50, 5, topic+".placed")
			ids := slices.Sorted(func(yield func(int64) bool) {
				for id := range committed {
					if !yield(id) {
						return
					}
				}
			})
			aggs := map[uuid.UUID]bool{}
			for _, a := range committed {
				aggs[a] = true
			}
			// What the dead relayer did: claim and reserve (seq 3), and,
			// when published, commit the batch with its progress.
			_, err := b.db.Pool.Exec(ctx, "UPDATE "+b.db.Tables.OutboxIdent()+" SET dispatched_at = now()")
			require.NoError(t, err)
			_, err = b.db.Pool.Exec(ctx, "INSERT INTO "+relay.LanesIdent(b.db.Tables)+` (lane, owner, epoch, lease_until, seq, ids, aggs)
				VALUES (1, 'dead', 4, now() - interval '1 second', 3, $1, $2)`, ids, slices.Collect(func(yield func(uuid.UUID) bool) {
				for a := range aggs {
					if !yield(a) {
						return
					}
				}
			}))
			require.NoError(t, err)
			hook := &testhook.Lanes{}
			r := b.eosRelayer(t, func(c *relay.Config) { c.Hooks = []relay.Hook{hook} })
			if published {
				l, _, err := b.txPublisher(t).OpenLane(ctx, r.Config().LaneID("poll-1"))
				require.NoError(t, err)
				msgs := make([]relay.Message, len(ids))
				for i, id := range ids {
					msgs[i] = relay.Message{ID: id, AggregateID: committed[id], Type: topic + ".placed", Topic: topic, Payload: []byte("{}")}
				}
				_, err = l.Publish(ctx, msgs, []byte(`{"seq": 3}`))
				require.NoError(t, err)
				l.Close()
			}
			run(t, r)
			require.Eventually(t, func() bool {
				ls := b.lanes(t)
				return len(ls) == 1 && ls[0].epoch > 4 && len(ls[0].ids) == 0
			}, 20*time.Second, 20*time.Millisecond, "the relayer should take lane 1 and settle its reservation")
			b.waitDrained(t, 20*time.Second)
			b.readOnce(t, committed, topic)
			// The hooks are told how the reservation was settled.
			opened := hook.Of(relay.LaneOpened)
			require.NotEmpty(t, opened)
			want := relay.LaneEvent{Kind: relay.LaneOpened, Lane: r.Config().LaneID("poll-1"), Returned: int64(len(ids))}
			if published {
				want.Published, want.Returned = int64(len(ids)), 0
			}
			require.Equal(t, want, opened[0])
		})
	}
}

// A relayer whose lane was taken over (its epoch moved on, as when it was
// paused past its lease and another adopted the lane) finds out at its
// next claim, steps down, logs it, takes a lane again and goes on: every
// event still arrives once.
func TestLaneLostStepsDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs testlog.Buffer
	hook := &testhook.Lanes{}
	r := b.eosRelayer(t, func(c *relay.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.Hooks = []relay.Hook{hook}
	})
	run(t, r)
	first := b.emitSpread(t, 20, 4, "stepdown.placed")
	b.waitDrained(t, 20*time.Second)
	_, err := b.db.Pool.Exec(context.Background(), "UPDATE "+relay.LanesIdent(b.db.Tables)+" SET epoch = epoch + 1")
	require.NoError(t, err)
	second := b.emitSpread(t, 20, 4, "stepdown.placed")
	b.waitDrained(t, 20*time.Second)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "relay stepping down") }, 10*time.Second, 20*time.Millisecond)
	lost := hook.Of(relay.LaneLost)
	require.Len(t, lost, 1, "the hooks are told the lane was lost")
	require.Equal(t, r.Config().LaneID("poll-1"), lost[0].Lane)
	require.ErrorContains(t, lost[0].Err, "lost its lane")
	require.Len(t, hook.Of(relay.LaneOpened), 2, "the lane it started with, and the one it took after")
	for id, agg := range second {
		first[id] = agg
	}
	b.readOnce(t, first, "stepdown")
}

// While another lane's reservation is open, its aggregates' later rows
// wait (they could otherwise reach the broker before the reservation
// does), and only those: the rest flows. Once the reservation is settled,
// they follow.
func TestOtherLanesReservationBlocksItsAggregates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	blocked, free := uuid.New(), uuid.New()
	_, err := b.db.Pool.Exec(ctx, "INSERT INTO "+relay.LanesIdent(b.db.Tables)+` (lane, owner, epoch, lease_until, seq, ids, aggs)
		VALUES (7, 'elsewhere', 1, now() + interval '1 hour', 1, '{0}', $1)`, []uuid.UUID{blocked})
	require.NoError(t, err)
	committed := map[int64]uuid.UUID{}
	var blockedIDs []int64
	for range 5 {
		id := b.emit(t, blocked, "blocking.placed", map[string]int{})
		committed[id] = blocked
		blockedIDs = append(blockedIDs, id)
		committed[b.emit(t, free, "blocking.placed", map[string]int{})] = free
	}
	run(t, b.eosRelayer(t, nil))
	require.Eventually(t, func() bool { return b.pending(t) == 5 }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, blockedIDs, b.pendingIDs(t), "only the reserved aggregate's rows wait")
	_, err = b.db.Pool.Exec(ctx, "UPDATE "+relay.LanesIdent(b.db.Tables)+" SET ids = NULL, aggs = NULL WHERE lane = 7")
	require.NoError(t, err)
	b.waitDrained(t, 20*time.Second)
	b.readOnce(t, committed, "blocking")
}

// A lane left with a reservation by a holder that died (its lease
// expired) blocks its aggregates until a running relayer adopts it: fences
// the dead holder, returns the unpublished rows to pending and releases
// the lane. Here the relayer already holds a lane of its own.
func TestOrphanLaneAdopted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	agg := uuid.New()
	committed := map[int64]uuid.UUID{}
	var orphan []int64
	for range 3 {
		id := b.emit(t, agg, "orphan.placed", map[string]int{})
		committed[id] = agg
		orphan = append(orphan, id)
	}
	_, err := b.db.Pool.Exec(ctx, "UPDATE "+b.db.Tables.OutboxIdent()+" SET dispatched_at = now() WHERE id = ANY($1)", orphan)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, "INSERT INTO "+relay.LanesIdent(b.db.Tables)+` (lane, owner, epoch, lease_until, seq, ids, aggs)
		VALUES (9, 'dead', 1, now() - interval '1 second', 1, $1, $2)`, orphan, []uuid.UUID{agg})
	require.NoError(t, err)
	// The relayer starts once the orphan is in place: running, it could
	// have published the orphan's rows itself before they were reserved.
	run(t, b.eosRelayer(t, nil))
	for range 3 {
		committed[b.emit(t, agg, "orphan.placed", map[string]int{})] = agg
	}
	b.waitDrained(t, 30*time.Second)
	recs := b.readOnce(t, committed, "orphan")
	require.Len(t, recs, 6)
	for _, l := range b.lanes(t) {
		if l.lane == 9 {
			require.Empty(t, l.ids, "the orphan's reservation is settled")
			require.Greater(t, l.epoch, int64(1), "the orphan was taken (its holder fenced)")
		}
	}
}

// Broker faults inside a lane's transactions (a coordinator that is
// loading, an EndTxn that fails, AddPartitionsToTxn refused, a fenced
// InitProducerID) are retried with backoff; the outcome is settled by the
// lane's progress, so a read_committed reader sees every event once.
func TestLaneBrokerFaultsRetriedWithoutDuplicates(t *testing.T) {
	t.Parallel()
	for _, f := range []struct {
		name string
		key  kmsg.Key
		err  *kerr.Error
	}{
		{"end txn", kmsg.EndTxn, kerr.CoordinatorNotAvailable},
		{"end txn timed out", kmsg.EndTxn, kerr.RequestTimedOut},
		{"add partitions", kmsg.AddPartitionsToTxn, kerr.ConcurrentTransactions},
		{"init producer id", kmsg.InitProducerID, kerr.CoordinatorLoadInProgress},
		{"find coordinator", kmsg.FindCoordinator, kerr.CoordinatorNotAvailable},
	} {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			topic := "fault" + fmt.Sprint(f.key)
			committed := b.emitSpread(t, 400, 8, topic+".placed")
			r := b.eosRelayer(t, func(c *relay.Config) { c.BatchSize = 50 })
			b.broker.Fault(kfake.Fault{Keys: []kmsg.Key{f.key}, TxnID: r.Config().LaneID("poll-1"), Err: f.err, Count: 3})
			run(t, r)
			b.waitDrained(t, 60*time.Second)
			b.readOnce(t, committed, topic)
		})
	}
}

// A row the broker refuses for good (too large) under exactly-once aborts
// its batch's transaction; the row is held as without exactly-once (its
// aggregate waits behind it), and the rows that rode along are sent again
// and arrive once.
func TestLanePoisonRowHeld(t *testing.T) {
	t.Parallel()
	b := setup(t, limitBroker())
	poisoned, other := uuid.New(), uuid.New()
	committed := map[int64]uuid.UUID{}
	for i := range 6 {
		committed[b.emit(t, other, "lanepoison.placed", map[string]int{"n": i})] = other
	}
	bad := b.emit(t, poisoned, "lanepoison.placed", map[string]string{"blob": randomText(150_000)})
	behind := b.emit(t, poisoned, "lanepoison.placed", map[string]int{})
	for i := range 6 {
		committed[b.emit(t, other, "lanepoison.placed", map[string]int{"n": i})] = other
	}
	hook := &testhook.Lanes{}
	run(t, b.eosRelayer(t, func(c *relay.Config) { c.Hooks = []relay.Hook{hook} }))
	require.Eventually(t, func() bool { return b.pending(t) == 2 }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, []int64{bad, behind}, b.pendingIDs(t))
	aborted := hook.Of(relay.LaneAborted)
	require.NotEmpty(t, aborted, "the hooks are told of the aborted transaction")
	require.ErrorIs(t, aborted[0].Err, relay.ErrAborted)
	holds := b.holds(t)
	require.Len(t, holds, 1)
	require.Equal(t, bad, holds[0].EventID)
	require.Equal(t, relay.ReasonTooLarge, holds[0].Reason)
	b.readOnce(t, committed, "lanepoison")
}

// Exactly-once switched off after a relayer with it died mid-batch: its
// reservation's rows are marked dispatched and only a lane's next holder
// could tell whether they reached the broker. A relayer without
// exactly-once returns them to pending (at-least-once: sent again), and
// bumps the lane's epoch so that its holder, back, steps down. A lane
// whose lease still runs is left to its holder, and the relayer warns that
// replicas with and without exactly-once are mixed.
func TestRelayerWithoutExactlyOnceReturnsOrphanedReservations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	orphaned := b.emitSpread(t, 40, 4, "orphaned.placed")
	live := b.emitSpread(t, 10, 2, "stillheld.placed")
	reserve := func(lane int, lease string, rows map[int64]uuid.UUID) {
		ids := slices.Sorted(maps.Keys(rows))
		_, err := b.db.Pool.Exec(ctx, "UPDATE "+b.db.Tables.OutboxIdent()+" SET dispatched_at = '2000-01-01' WHERE id = ANY($1)", ids)
		require.NoError(t, err)
		_, err = b.db.Pool.Exec(ctx, "INSERT INTO "+relay.LanesIdent(b.db.Tables)+` (lane, owner, epoch, lease_until, seq, ids, aggs)
			VALUES ($1, $2, 7, now() + $3::interval, 3, $4, '{}')`, lane, fmt.Sprint("host-", lane, "/1"), lease, ids)
		require.NoError(t, err)
	}
	reserve(1, "-1 second", orphaned)
	reserve(2, "1 hour", live)
	var logs testlog.Buffer
	run(t, b.relayer(t, func(c *relay.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) }))

	b.waitDrained(t, 20*time.Second)
	b.readOnce(t, orphaned, "orphaned")
	ls := b.lanes(t)
	require.Len(t, ls, 2)
	require.Equal(t, laneRow{lane: 1, epoch: 8, seq: 3, ids: []int64{}}, ls[0], "the orphan's reservation cleared, its epoch one up")
	require.Equal(t, int64(7), ls[1].epoch, "a lane whose lease runs is its holder's")
	require.Len(t, ls[1].ids, len(live))
	var untouched int
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+b.db.Tables.OutboxIdent()+" WHERE dispatched_at = '2000-01-01'").Scan(&untouched))
	require.Equal(t, len(live), untouched, "the live lane's rows stay as its holder left them")
	require.Contains(t, logs.String(), "returned to pending the rows an exactly-once relayer left reserved")
	require.Contains(t, logs.String(), "lane 2: host-2/1", "the mix of replicas is named")
}
