package relay_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// limitBroker is a broker whose message.max.bytes is 100,000, small enough
// that a test's large events exceed it.
func limitBroker() kfake.Opt {
	return kfake.BrokerConfigs(map[string]string{"message.max.bytes": "100000"})
}

// randomText is n hex characters of random bytes: a JSON string that no
// compression shrinks much.
func randomText(n int) string {
	raw := make([]byte, n/2+1)
	_, _ = rand.Read(raw)
	return hex.EncodeToString(raw)[:n]
}

// pendingIDs lists the rows not yet dispatched, in id order.
func (b *bundle) pendingIDs(t *testing.T) []int64 {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), "SELECT id FROM "+b.db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL ORDER BY id")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// client builds a publisher client on the bundle's broker.
func (b *bundle) client(t *testing.T) *kgo.Client {
	t.Helper()
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()},
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	return client
}

// Several rows of one aggregate fail in one batch (here all three are too
// large): the failure belongs to the aggregate's first row, not its last
// (which would leave the watchdog listing the first with no error); the
// rows behind it are listed as waiting for it; and the watchdog reports the
// held row as stuck at once, not after StuckAfter.
func TestFailureRecordedAgainstTheAggregatesFirstRow(t *testing.T) {
	t.Parallel()
	b := setup(t, limitBroker())
	agg := uuid.New()
	var ids []int64
	for range 3 {
		ids = append(ids, b.db.InsertRaw(t, agg, "order.placed", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(150_000)), "NULL"))
	}
	// And a broker-side refusal of a whole request: the publisher is told
	// the limit is 1 MB, so it sends and the broker refuses.
	pub := kafkapub.NewPublisher(b.client(t), kafkapub.PublisherConfig{MaxMessageBytes: 1 << 20})
	other := uuid.New()
	var otherIDs []int64
	for range 3 {
		otherIDs = append(otherIDs, b.db.InsertRaw(t, other, "payment.captured", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(150_000)), "NULL"))
	}
	run(t, b.relayer(t, nil))
	run(t, b.relayer(t, func(c *relay.Config) { c.Sink = pub }))
	require.Eventually(t, func() bool { return len(b.holds(t)) == 2 }, 20*time.Second, 20*time.Millisecond)
	holds := b.holds(t)
	require.Equal(t, []int64{ids[0], otherIDs[0]}, []int64{holds[0].EventID, holds[1].EventID}, "each aggregate's first row takes the failure")

	rep, err := ops.Check(context.Background(), b.db.Pool, ops.WatchdogConfig{Tables: b.db.Tables})
	require.NoError(t, err)
	require.False(t, rep.Healthy(), "held rows are stuck at once")
	require.Equal(t, int64(6), rep.Lag.Stuck)
	require.Equal(t, int64(2), rep.Held)
	for _, s := range rep.Stuck {
		head := ids[0]
		if s.AggregateID == other {
			head = otherIDs[0]
		}
		if s.ID == head {
			require.Equal(t, relay.ReasonTooLarge, s.Reason)
			require.Contains(t, s.LastError, "MESSAGE_TOO_LARGE")
			require.Zero(t, s.BlockedBy)
			continue
		}
		require.Equal(t, head, s.BlockedBy)
		require.Empty(t, s.LastError, "a row behind the failed one has no failure of its own")
	}
	s, err := ops.ReadStats(context.Background(), b.db.Pool, ops.StatsConfig{Tables: b.db.Tables})
	require.NoError(t, err)
	require.Equal(t, rep.Held, s.Held, "stats and watchdog agree")
	require.Equal(t, rep.Lag.Stuck, s.Stuck)
}

// Holds live in the database: a row one relayer held is not retried by
// another before the hold ends, and each retry doubles the hold, with
// jitter so that holds recorded together drift apart.
func TestHoldsAreSharedAndBackOff(t *testing.T) {
	t.Parallel()
	b := setup(t, limitBroker())
	var big []int64
	for range 4 {
		big = append(big, b.db.InsertRaw(t, uuid.New(), "order.placed", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(120_000)), "NULL"))
	}
	for range 3 {
		run(t, b.relayer(t, func(c *relay.Config) { c.HoldOut = 400 * time.Millisecond; c.MaxHoldOut = 800 * time.Millisecond }))
	}
	require.Eventually(t, func() bool { return len(b.holds(t)) == 4 }, 10*time.Second, 10*time.Millisecond)
	first := b.holds(t)
	// Within the first hold (at least 360 ms with jitter) no relayer tries
	// again, though three are polling every 50 ms.
	time.Sleep(250 * time.Millisecond)
	var dbNow time.Time
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT now()").Scan(&dbNow))
	for i, h := range b.holds(t) {
		if dbNow.Before(first[i].Until) {
			require.Equal(t, 1, h.Attempts, "event %d retried while held", h.EventID)
		}
	}
	require.Eventually(t, func() bool {
		for _, h := range b.holds(t) {
			if h.Attempts < 3 {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond)
	later := b.holds(t)
	ends := map[time.Time]bool{}
	for i, h := range later {
		require.Equal(t, first[i].EventID, h.EventID)
		ends[h.Until] = true
	}
	require.Len(t, ends, len(later), "holds recorded together end at different times")
	require.Equal(t, big, b.pendingIDs(t))
	var ids []string
	for _, id := range big {
		ids = append(ids, fmt.Sprint(id))
	}
	t.Logf("held %s; attempts and ends: %v", strings.Join(ids, ","), later)
}
