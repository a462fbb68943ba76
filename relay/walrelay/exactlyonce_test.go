package walrelay_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/testhook"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// txSink is a transactional Kafka sink on b's broker, as a relayer
// process with --exactly-once has.
func (b *bundle) txSink(t testing.TB) *kafkapub.TxPublisher {
	t.Helper()
	cfg := kafka.ClientConfig{Brokers: []string{b.broker.Addr()}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}}
	client, err := kafkapub.NewPublisherClient(cfg)
	require.NoError(t, err)
	t.Cleanup(client.Close)
	tp, err := kafkapub.NewTxPublisher(client, kafkapub.PublisherConfig{Source: "wal"}, kafkapub.TxConfig{Client: cfg, TransactionTimeout: 5 * time.Second})
	require.NoError(t, err)
	return tp
}

// txRelayer is a relayer with ExactlyOnce on a sink of its own, logging
// to log when not nil.
func (b *bundle) txRelayer(t testing.TB, log *syncBuffer, mod func(*walrelay.Config)) *walrelay.Relayer {
	t.Helper()
	sink := b.txSink(t)
	return b.relayer(t, func(cfg *walrelay.Config) {
		cfg.Sink, cfg.ExactlyOnce = sink, true
		if log != nil {
			cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
		}
		if mod != nil {
			mod(cfg)
		}
	})
}

// syncBuffer is a log a relayer writes while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// emitTxs writes txs transactions of per events each, spread over aggs,
// and returns their ids in order.
func (b *bundle) emitTxs(t *testing.T, txs, per int, aggs []uuid.UUID) []int64 {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	for i := range txs {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			for k := range per {
				id, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: aggs[(i*per+k)%len(aggs)], Type: "eo.placed", Payload: map[string]int{"n": i*per + k}})
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		}))
	}
	return ids
}

// committedOnce reads the topic with read_committed until want events
// came and the topic went quiet, and checks that every one came exactly
// once, in per-aggregate order.
func (b *bundle) committedOnce(t *testing.T, want []int64) {
	t.Helper()
	recs := kafkatest.ReadCommitted(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeastThenQuiet(len(want), 500*time.Millisecond), "eo")
	set := map[int64]bool{}
	for _, id := range want {
		set[id] = true
	}
	require.Zero(t, checkOrder(t, recs, set), "duplicates visible to a read_committed reader")
	require.Len(t, recs, len(want))
}

// A relayer killed between its Kafka commit and the slot's confirmation
// leaves the slot behind what the lane holds; the next lead reads the
// lane's progress and publishes nothing twice, even where a batch ended
// inside a Postgres transaction. The slot's old position is kept in a
// copy of it and put back after a first relayer published everything.
func TestExactlyOnceSkipsWhatTheLaneHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	require.NoError(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
	saved := "eo_saved_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	_, err := b.db.Pool.Exec(ctx, `SELECT pg_copy_logical_replication_slot($1, $2)`, b.slot, saved)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, saved)
	})

	aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	// Batches of 7 over transactions of 5: batches end inside them.
	small := func(cfg *walrelay.Config) { cfg.BatchSize = 7 }
	first := b.emitTxs(t, 12, 5, aggs)
	r1 := b.txRelayer(t, nil, small)
	stop := run(t, r1)
	require.Eventually(t, func() bool { return r1.Stats().Dispatched == int64(len(first)) }, 20*time.Second, 20*time.Millisecond)
	stop()
	require.Zero(t, r1.Skipped())

	// The slot as if the confirmation never reached the server. The
	// stopped relayer's walsender may not have noticed yet that its
	// client left: the slot is active until then.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err = b.db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, b.slot)
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	require.NoError(t, err, "drop the slot")
	_, err = b.db.Pool.Exec(ctx, `SELECT pg_copy_logical_replication_slot($1, $2)`, saved, b.slot)
	require.NoError(t, err)

	log := &syncBuffer{}
	hook := &testhook.Lanes{}
	r2 := b.txRelayer(t, log, func(cfg *walrelay.Config) {
		small(cfg)
		cfg.Hooks = []relay.Hook{hook}
	})
	run(t, r2)
	second := b.emitTxs(t, 4, 5, aggs)
	require.Eventually(t, func() bool { return r2.Stats().Dispatched == int64(len(second)) }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, int64(len(first)), r2.Skipped(), "every event of the first run is read again and skipped")
	require.Contains(t, log.String(), "caught up with the lane's progress")
	require.Equal(t, []relay.LaneEvent{{Kind: relay.LaneSkipped, Lane: r2.Config().LaneID("wal/" + b.slot), Skipped: int64(len(first))}},
		hook.Of(relay.LaneSkipped), "the hooks are told once how many were skipped")
	require.Len(t, hook.Of(relay.LaneOpened), 1)
	b.committedOnce(t, append(first, second...))
}

// Another holder opening the lane fences the leader: its next transaction
// fails, it says it lost the lane and steps down, then (alone) leads
// again, reopens the lane and goes on from its progress: every event is
// visible once.
func TestExactlyOnceFencedLeaderStepsDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	log := &syncBuffer{}
	hook := &testhook.Lanes{}
	r := b.txRelayer(t, log, func(cfg *walrelay.Config) { cfg.Hooks = []relay.Hook{hook} })
	run(t, r)
	waitLeading(t, r)
	aggs := []uuid.UUID{uuid.New(), uuid.New()}
	ids := b.emitTxs(t, 3, 4, aggs)
	require.Eventually(t, func() bool { return r.Stats().Dispatched == int64(len(ids)) }, 20*time.Second, 20*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	other, progress, err := b.txSink(t).OpenLane(ctx, r.Config().LaneID("wal/"+b.slot))
	require.NoError(t, err)
	require.NotNil(t, progress, "the relayer's transactions recorded progress")
	ids = append(ids, b.emitTxs(t, 3, 4, aggs)...)
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "lost the lane to another relayer") }, 20*time.Second, 20*time.Millisecond)
	// The other holder publishes nothing: the relayer takes the lane back.
	_, err = other.Publish(ctx, nil, progress)
	other.Close()
	require.Eventually(t, func() bool { return r.Stats().Dispatched == int64(len(ids)) }, 20*time.Second, 20*time.Millisecond)
	t.Logf("the fenced holder's later publish: %v", err)
	b.committedOnce(t, ids)
	lost := hook.Of(relay.LaneLost)
	require.Len(t, lost, 1, "the hooks are told the lane was lost")
	require.ErrorIs(t, lost[0].Err, relay.ErrFenced)
	require.Len(t, hook.Of(relay.LaneOpened), 2, "opened, then opened again after the other holder")
}

// Faults of the transaction protocol on the broker (the coordinator
// unavailable or moved, a transaction in a bad state, the producer id
// refused, a transaction's records refused for a while) are ridden out,
// without a duplicate or a loss.
func TestExactlyOnceRidesOutTransactionFaults(t *testing.T) {
	t.Parallel()
	for _, f := range []struct {
		name string
		key  kmsg.Key
		err  *kerr.Error
	}{
		{"EndTxn coordinator not available", kmsg.EndTxn, kerr.CoordinatorNotAvailable},
		{"EndTxn not coordinator", kmsg.EndTxn, kerr.NotCoordinator},
		{"EndTxn transaction timed out", kmsg.EndTxn, kerr.InvalidTxnState},
		// The client adds partitions to a transaction with its produce
		// requests (KIP-890) and sends no AddPartitionsToTxn to this
		// broker: the produce requests of a transaction are faulted.
		{"Produce not enough replicas", kmsg.Produce, kerr.NotEnoughReplicas},
		{"Produce unknown server error", kmsg.Produce, kerr.UnknownServerError},
		{"InitProducerID coordinator not available", kmsg.InitProducerID, kerr.CoordinatorNotAvailable},
		{"FindCoordinator coordinator not available", kmsg.FindCoordinator, kerr.CoordinatorNotAvailable},
	} {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := b.txRelayer(t, nil, func(cfg *walrelay.Config) { cfg.BatchSize = 5 })
			aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
			run(t, r)
			waitLeading(t, r)
			ids := b.emitTxs(t, 2, 5, aggs)
			require.Eventually(t, func() bool { return r.Stats().Dispatched == int64(len(ids)) }, 20*time.Second, 20*time.Millisecond)
			h := b.broker.Fault(kfake.Fault{Keys: []kmsg.Key{f.key}, Err: f.err, Count: 3})
			if f.key == kmsg.InitProducerID || f.key == kmsg.FindCoordinator {
				// Only a lane opened again asks: make the relayer do so.
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				h.Remove()
				lane, _, err := b.txSink(t).OpenLane(ctx, r.Config().LaneID("wal/"+b.slot))
				require.NoError(t, err)
				lane.Close()
				h = b.broker.Fault(kfake.Fault{Keys: []kmsg.Key{f.key}, Err: f.err, Count: 3})
			}
			defer h.Remove()
			ids = append(ids, b.emitTxs(t, 6, 5, aggs)...)
			require.Eventually(t, func() bool { return r.Stats().Dispatched >= int64(len(ids)) }, 30*time.Second, 20*time.Millisecond)
			b.committedOnce(t, ids)
			require.Equal(t, 3, h.Hits(), "the faults were all met")
			t.Logf("%s: %d failed tries, %d dispatched (duplicates counted), %d skipped", f.name, r.Stats().FailedBatches, r.Stats().Dispatched, r.Skipped())
		})
	}
}

// The lane's progress is the relayer's: a relayer whose lane holds
// progress of another kind refuses to stream, saying why.
func TestExactlyOnceRefusesForeignProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.txRelayer(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lane, _, err := b.txSink(t).OpenLane(ctx, r.Config().LaneID("wal/"+b.slot))
	require.NoError(t, err)
	_, err = lane.Publish(ctx, nil, []byte(`{"lanes":[1,2]}`))
	require.NoError(t, err)
	lane.Close()
	log := &syncBuffer{}
	r = b.txRelayer(t, log, nil)
	run(t, r)
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "is not a WAL position") }, 20*time.Second, 20*time.Millisecond)
	require.False(t, r.Stats().Leading)
}
