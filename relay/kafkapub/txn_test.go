package kafkapub_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// txSetup starts a dev broker and returns a way to make TxPublishers on
// it (each with its own plain client, as separate relayer processes
// have).
func txSetup(t *testing.T) (*devkafka.Broker, func() *kafkapub.TxPublisher) {
	t.Helper()
	b, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	cfg := kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{
		kgo.RecordDeliveryTimeout(5 * time.Second),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
	}}
	return b, func() *kafkapub.TxPublisher {
		cl, err := kafkapub.NewPublisherClient(cfg)
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		tp, err := kafkapub.NewTxPublisher(cl, kafkapub.PublisherConfig{}, kafkapub.TxConfig{Client: cfg})
		require.NoError(t, err)
		return tp
	}
}

func txBatch(first int64, n int, topic string, aggs ...uuid.UUID) []relay.Message {
	var out []relay.Message
	for i := range n {
		out = append(out, msg(first+int64(i), aggs[i%len(aggs)], topic, 40))
	}
	return out
}

func openLane(t *testing.T, tp *kafkapub.TxPublisher, id string) (relay.Lane, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, progress, err := tp.OpenLane(ctx, id)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	return l, progress
}

func committedIDs(t *testing.T, addr, topic string, want int) []int64 {
	t.Helper()
	var ids []int64
	for _, r := range kafkatest.ReadCommitted(t, addr, 20*time.Second, kafkatest.AtLeastThenQuiet(want, 300*time.Millisecond), topic) {
		ids = append(ids, kafkatest.EventID(r))
	}
	return ids
}

// A lane's batches commit with their progress; opening the lane again, in
// another publisher (another process), returns the progress of its last
// committed transaction, and a reader of committed data sees every record
// once.
func TestLaneCommitsBatchWithProgress(t *testing.T) {
	t.Parallel()
	b, newTx := txSetup(t)
	l, progress := openLane(t, newTx(), "outbox/test.lane-commit/0")
	require.Nil(t, progress, "a lane never committed has no progress")
	aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	ctx := context.Background()
	for k := range 3 {
		errs, err := l.Publish(ctx, txBatch(int64(1+10*k), 10, "orders", aggs...), []byte(strconv.Itoa(k+1)))
		require.NoError(t, err)
		for _, e := range errs {
			require.NoError(t, e)
		}
	}
	require.Len(t, committedIDs(t, b.Addr(), "orders", 30), 30)
	_, progress = openLane(t, newTx(), "outbox/test.lane-commit/0")
	require.Equal(t, "3", string(progress), "the last committed transaction's progress")
	_, other := openLane(t, newTx(), "outbox/test.lane-commit/1")
	require.Nil(t, other, "progress is per lane")
}

// Opening a lane fences its earlier holder: the old holder's next publish
// fails with ErrFenced and nothing of it becomes visible, while the new
// holder publishes.
func TestLaneOpenedAgainFencesTheOldHolder(t *testing.T) {
	t.Parallel()
	b, newTx := txSetup(t)
	id := "outbox/test.lane-fence/0"
	old, _ := openLane(t, newTx(), id)
	agg := uuid.New()
	ctx := context.Background()
	_, err := old.Publish(ctx, txBatch(1, 5, "fence", agg), []byte("1"))
	require.NoError(t, err)
	cur, progress := openLane(t, newTx(), id)
	require.Equal(t, "1", string(progress))
	_, err = old.Publish(ctx, txBatch(6, 5, "fence", agg), []byte("2"))
	require.ErrorIs(t, err, relay.ErrFenced, "the old holder must not commit after the lane was opened again")
	_, err = cur.Publish(ctx, txBatch(11, 5, "fence", agg), []byte("2"))
	require.NoError(t, err)
	ids := committedIDs(t, b.Addr(), "fence", 10)
	require.Equal(t, []int64{1, 2, 3, 4, 5, 11, 12, 13, 14, 15}, ids, "nothing the fenced holder sent is visible")
}

// A record the broker refuses aborts the whole transaction: nothing of it
// is visible, the refused record alone carries a permanent error (found
// by sending halves in transactions that are aborted), the others are
// retriable, and the lane goes on with the next batch.
func TestLaneAbortsWholeOnARefusedRecord(t *testing.T) {
	t.Parallel()
	b, newTx := txSetup(t)
	l, _ := openLane(t, newTx(), "outbox/test.lane-abort/0")
	refused := int64(6)
	fault := b.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Topic: "abort", Err: kerr.InvalidRecord, When: carries(refused)})
	aggs := []uuid.UUID{uuid.New(), uuid.New()}
	batch := txBatch(1, 12, "abort", aggs...)
	errs, err := l.Publish(context.Background(), batch, []byte("1"))
	require.ErrorIs(t, err, relay.ErrAborted)
	for i, m := range batch {
		if m.ID == refused {
			require.True(t, relay.IsPermanent(errs[i]), "the refused record is to blame: %v", errs[i])
			continue
		}
		require.ErrorIs(t, errs[i], relay.ErrAborted, "record %d only rode along", m.ID)
		require.False(t, relay.IsPermanent(errs[i]))
	}
	fault.Remove()
	_, err = l.Publish(context.Background(), txBatch(13, 4, "abort", aggs...), []byte("2"))
	require.NoError(t, err)
	require.Equal(t, []int64{13, 14, 15, 16}, sorted(committedIDs(t, b.Addr(), "abort", 4)), "nothing of the aborted transaction is visible")
}

// The progress of a lane is found behind many records of other lanes: it
// is read backwards in growing windows, not from the topic's start only.
func TestLaneProgressFoundBehindOtherLanes(t *testing.T) {
	t.Parallel()
	b, newTx := txSetup(t)
	id := "outbox/test.lane-far/0"
	l, _ := openLane(t, newTx(), id)
	_, err := l.Publish(context.Background(), txBatch(1, 2, "far", uuid.New()), []byte("mine"))
	require.NoError(t, err)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	require.NoError(t, err)
	defer cl.Close()
	for i := range 3000 {
		cl.Produce(context.Background(), &kgo.Record{Topic: kafkapub.DefaultProgressTopic, Key: []byte(fmt.Sprintf("other/%d", i%7)), Value: []byte("x")}, nil)
	}
	require.NoError(t, cl.Flush(context.Background()))
	_, progress := openLane(t, newTx(), id)
	require.Equal(t, "mine", string(progress))
}

func sorted(ids []int64) []int64 {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// A holder fenced in the middle of a transaction (its records written,
// its commit not yet asked for, as a relayer paused by SIGSTOP) loses that
// transaction: opening the lane aborts it, so readers of committed data
// are not held back by it and never see its records, and its late commit
// fails.
func TestLaneOpenedAgainAbortsTheOldHoldersOpenTransaction(t *testing.T) {
	t.Parallel()
	b, newTx := txSetup(t)
	id := "outbox/test.lane-midtx/0"
	zombie, err := kgo.NewClient(append(kafka.TransactionalProducerOptions(id, 30*time.Second), kgo.SeedBrokers(b.Addr()))...)
	require.NoError(t, err)
	defer zombie.Close()
	ctx := context.Background()
	require.NoError(t, zombie.BeginTransaction())
	require.NoError(t, zombie.ProduceSync(ctx, &kgo.Record{Topic: "midtx", Key: []byte(uuid.NewString()), Value: []byte(`"zombie"`),
		Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte("1")}}}).FirstErr())

	cur, _ := openLane(t, newTx(), id)
	_, err = cur.Publish(ctx, txBatch(2, 3, "midtx", uuid.New()), []byte("1"))
	require.NoError(t, err)
	require.Equal(t, []int64{2, 3, 4}, sorted(committedIDs(t, b.Addr(), "midtx", 3)), "the new holder's records are visible, the fenced one's never")
	require.Error(t, zombie.EndTransaction(ctx, kgo.TryCommit), "the fenced holder's commit fails")
	require.Equal(t, []int64{2, 3, 4}, sorted(committedIDs(t, b.Addr(), "midtx", 3)))
}

// Whatever the broker does to a lane's transaction (a coordinator that
// moves or loads, a transaction timed out, produce requests refused for a
// while), the lane's contract holds: a nil error means the batch and its
// progress are visible, ErrAborted means none of it is, and after any
// other error the progress read on reopening says which. A source that
// follows the contract publishes every batch exactly once.
func TestLaneContractHoldsUnderCoordinatorFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fault kfake.Fault
		// atOpen: the fault strikes when the lane is opened again.
		atOpen bool
	}{
		{"EndTxn not coordinator", kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, TopLevel: true, Err: kerr.NotCoordinator}, false},
		{"EndTxn coordinator loading", kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, TopLevel: true, Err: kerr.CoordinatorLoadInProgress, Count: 3}, false},
		{"EndTxn producer fenced", kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, TopLevel: true, Err: kerr.ProducerFenced}, false},
		{"EndTxn transaction timed out", kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, TopLevel: true, Err: kerr.InvalidProducerEpoch}, false},
		{"produce not enough replicas", kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "faults", Err: kerr.NotEnoughReplicas}, false},
		{"FindCoordinator unavailable", kfake.Fault{Keys: []kmsg.Key{kmsg.FindCoordinator}, TxnID: "outbox/test.lane-faults/0", TopLevel: true, Err: kerr.CoordinatorNotAvailable, Count: 2}, true},
		{"InitProducerID coordinator loading", kfake.Fault{Keys: []kmsg.Key{kmsg.InitProducerID}, TopLevel: true, Err: kerr.CoordinatorLoadInProgress, Count: 2}, true},
		{"InitProducerID concurrent transactions", kfake.Fault{Keys: []kmsg.Key{kmsg.InitProducerID}, TopLevel: true, Err: kerr.ConcurrentTransactions, Count: 2}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, newTx := txSetup(t)
			tp := newTx()
			id := "outbox/test.lane-faults/0"
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			l, progress, err := tp.OpenLane(ctx, id)
			require.NoError(t, err)
			defer func() {
				if l != nil {
					l.Close()
				}
			}()
			done := 0
			if progress != nil {
				done, _ = strconv.Atoi(string(progress))
			}
			agg := uuid.New()
			var outcomes []string
			var fault *kfake.FaultHandle
			for done < 4 {
				if done == 1 && fault == nil {
					fault = b.Fault(tc.fault)
					if tc.atOpen {
						l.Close()
						l, progress, err = tp.OpenLane(ctx, id)
						require.NoError(t, err, "opening the lane through the fault")
						require.Equal(t, "1", string(progress))
					}
				}
				next := done + 1
				_, err := l.Publish(ctx, txBatch(int64(10*next), 5, "faults", agg), []byte(strconv.Itoa(next)))
				switch {
				case err == nil:
					outcomes = append(outcomes, "committed")
					done = next
				case errors.Is(err, relay.ErrAborted):
					outcomes = append(outcomes, "aborted")
				default:
					outcomes = append(outcomes, "unknown: "+err.Error())
					l.Close()
					l, progress, err = tp.OpenLane(ctx, id)
					require.NoError(t, err, "reopening the lane after %v", outcomes)
					done = 0
					if progress != nil {
						done, _ = strconv.Atoi(string(progress))
					}
				}
				require.Less(t, len(outcomes), 30, "no progress: %v", outcomes)
			}
			var want []int64
			for k := 1; k <= 4; k++ {
				for i := range 5 {
					want = append(want, int64(10*k+i))
				}
			}
			require.Equal(t, want, committedIDs(t, b.Addr(), "faults", len(want)), "every batch once, in order; outcomes %v", outcomes)
			require.Positive(t, fault.Hits(), "the fault never struck")
			t.Logf("outcomes: %v", outcomes)
		})
	}
}

// Another lane's transaction, open on the progress topic since before
// this lane's last commit, holds the partition's last stable offset in
// front of this lane's progress record: reading the progress must wait
// for it to end, never return the progress before.
func TestLaneProgressNotHiddenByAnotherLanesOpenTransaction(t *testing.T) {
	t.Parallel()
	b, newTx := txSetup(t)
	ctx := context.Background()
	id := "outbox/test.lane-lso/0"
	l, _ := openLane(t, newTx(), id)
	_, err := l.Publish(ctx, txBatch(1, 2, "lso", uuid.New()), []byte("1"))
	require.NoError(t, err)
	other, err := kgo.NewClient(append(kafka.TransactionalProducerOptions("outbox/test.lane-lso/1", 30*time.Second), kgo.SeedBrokers(b.Addr()))...)
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.BeginTransaction())
	require.NoError(t, other.ProduceSync(ctx, &kgo.Record{Topic: kafkapub.DefaultProgressTopic, Key: []byte("outbox/test.lane-lso/1"), Value: []byte("7")}).FirstErr())
	_, err = l.Publish(ctx, txBatch(3, 2, "lso", uuid.New()), []byte("2"))
	require.NoError(t, err)
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = other.EndTransaction(ctx, kgo.TryCommit)
	}()
	_, progress := openLane(t, newTx(), id)
	require.Equal(t, "2", string(progress), "the progress committed behind another lane's open transaction")
}
