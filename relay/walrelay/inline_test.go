package walrelay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// stallSink is a broker that does not answer its first stall publishes:
// each waits for its context to end and fails.
type stallSink struct {
	fakesink.Kafka
	mu      sync.Mutex
	stall   int
	stalled []int64 // ids of the publishes that stalled
	got     []int64 // ids acknowledged, in order
}

func (s *stallSink) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := make([]error, len(msgs))
	s.mu.Lock()
	stall := s.stall > 0
	if stall {
		s.stall--
		for _, m := range msgs {
			s.stalled = append(s.stalled, m.ID)
		}
	}
	s.mu.Unlock()
	if stall {
		<-ctx.Done()
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		s.got = append(s.got, m.ID)
	}
	return errs
}

func (s *stallSink) state() (stalled, got []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.stalled...), append([]int64(nil), s.got...)
}

// A small batch is published on the stream goroutine for a bounded time
// only: when the broker does not answer within it, the batch is sent
// again from the publisher goroutine, in order, and the slot is
// confirmed past it only once that is acknowledged. Meanwhile the events
// behind it wait their turn and are not acknowledged ahead of it.
func TestSmallBatchStalledOnTheStreamIsSentAgainInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := &stallSink{stall: 1}
	r := b.relayer(t, func(c *walrelay.Config) { c.Sink = sink })
	walrelay.SetInlineBound(r, 200*time.Millisecond)
	run(t, r)
	waitLeading(t, r)
	ctx := context.Background()
	agg := uuid.New()
	var ids []int64
	for range 3 {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			id, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: 1})
			ids = append(ids, id)
			return err
		}))
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, got := sink.state()
		assert.Equal(c, ids, got)
	}, 30*time.Second, 20*time.Millisecond)
	stalled, _ := sink.state()
	require.NotEmpty(t, stalled)
	require.Equal(t, ids[0], stalled[0], "the first event's publish stalled")
	require.Zero(t, r.Stats().Parked)
	// The slot follows the broker: confirmed past the last event.
	var end string
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end))
	require.Eventually(t, func() bool {
		var ok bool
		err := b.db.Pool.QueryRow(ctx, "SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", b.slot, end).Scan(&ok)
		return err == nil && ok
	}, 30*time.Second, 20*time.Millisecond)
}
