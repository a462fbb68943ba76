package walrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// When a steady load stops, the slot's confirmed position reaches the last
// transaction soon after the broker acknowledged it, not a whole
// StatusInterval later: the relayer tells the server within about 100ms of
// an acknowledgement it has not told yet, however recently it sent the
// previous status update. With StatusInterval at 5s, a relayer that only
// reported on its interval would take up to 5s here.
func TestSlotFollowsTheBrokerSoonAfterLoadStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relayer(t, func(c *walrelay.Config) { c.StatusInterval = 5 * time.Second })
	run(t, r)
	waitLeading(t, r)
	agg := uuid.New()
	for round := range 3 {
		// About 500 events/s for half a second: status updates go out
		// every 100ms, so the load's last batch comes soon after one.
		var last string
		for i := range 250 {
			require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				if _, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]int{"n": i}}); err != nil {
					return err
				}
				// Inside the transaction: its commit ends past this.
				return tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&last)
			}))
			time.Sleep(2 * time.Millisecond)
		}
		want := int64(250 * (round + 1))
		require.Eventually(t, func() bool { return r.Stats().Published >= want }, 30*time.Second, time.Millisecond)
		acked := time.Now()
		var confirmed bool
		for time.Since(acked) < 10*time.Second {
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, b.slot, last).Scan(&confirmed))
			if confirmed {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		took := time.Since(acked)
		t.Logf("round %d: the slot confirmed the last transaction %s after the broker's acknowledgement", round, took.Round(time.Millisecond))
		require.True(t, confirmed, "the slot never confirmed the last transaction")
		// Generous for a loaded machine, and far below StatusInterval.
		require.Less(t, took, 2500*time.Millisecond, "the slot waited for StatusInterval")
	}
}
