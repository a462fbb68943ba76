package walrelay_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// Outage after outage of Postgres, a WAL relayer leads and publishes
// again within seconds of the server's return, with the default backoff
// (100ms doubling to 30s): the backoff starts over once a lead made
// progress, and once a standby found the database up and another
// relayer leading, instead of adding up across outages. After the
// outages, the standby takes over within seconds when the leader stops.
func TestLeadsAgainSoonAfterEachPostgresOutage(t *testing.T) {
	t.Parallel()
	c := privateLogical(t)
	b := setupOn(t, c.URL())
	ctx := context.Background()
	defaults := func(cfg *walrelay.Config) { cfg.BackoffMin, cfg.BackoffMax, cfg.Messages = 0, 0, false }
	rs := []*walrelay.Relayer{b.relayer(t, defaults), b.relayer(t, defaults)}
	stops := []func(){run(t, rs[0]), run(t, rs[1])}
	leader := func() int {
		for i, r := range rs {
			if r.Stats().Leading {
				return i
			}
		}
		return -1
	}
	require.Eventually(t, func() bool { return leader() >= 0 }, 15*time.Second, 20*time.Millisecond)

	// published emits an event (retrying while the pool's connections
	// are those of the server before the restart) and waits until the
	// broker has it.
	published := func(within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		var id int64
		require.Eventually(t, func() bool {
			return pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				var err error
				id, err = b.producer.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"n": 1}})
				return err
			}) == nil
		}, within, 50*time.Millisecond, "the event could not be written")
		kafkatest.Read(t, b.broker.Addr(), within-time.Since(start), func(recs []*kgo.Record) bool {
			return slices.ContainsFunc(recs, func(r *kgo.Record) bool { return kafkatest.EventID(r) == id })
		}, "order")
		return time.Since(start)
	}
	published(20 * time.Second)
	for i := range 4 {
		// Each lead lasts long enough for the slot to move (a commit,
		// the keepalives).
		time.Sleep(time.Second)
		require.NoError(t, c.Restart(ctx, 1500*time.Millisecond))
		took := published(10 * time.Second)
		t.Logf("outage %d: published again %s after Postgres was back", i+1, took.Round(time.Millisecond))
	}

	l := leader()
	require.GreaterOrEqual(t, l, 0)
	stops[l]()
	standby := rs[1-l]
	require.Eventually(t, func() bool { return standby.Stats().Leading }, 10*time.Second, 20*time.Millisecond, "the standby did not take over")
	published(10 * time.Second)
}
