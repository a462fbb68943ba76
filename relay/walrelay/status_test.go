package walrelay_test

import (
	"context"
	"fmt"
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
		require.Eventually(t, func() bool { return r.Stats().Dispatched >= want }, 30*time.Second, time.Millisecond)
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

// A backlog of small transactions goes out in large batches: while the
// stream is behind, a batch waits (briefly) for more events rather than
// leaving with the few read so far, whose per-batch cost would take the
// CPU the walsender needs to decode.
func TestBacklogGoesOutInLargeBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	require.NoError(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
	const txs, per = 2000, 10
	_, err := b.db.Pool.Exec(ctx, `DO $$ BEGIN FOR i IN 1..`+fmt.Sprint(txs)+` LOOP
		INSERT INTO `+b.db.Tables.OutboxIdent()+` (aggregate_id, type, payload)
		SELECT md5((g % 100)::text)::uuid, 'order.placed', jsonb_build_object('n', g) FROM generate_series(1, `+fmt.Sprint(per)+`) g;
		COMMIT; END LOOP; END $$`)
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond) // the backlog is older than behindAge
	r := b.relayer(t, nil)
	run(t, r)
	require.Eventually(t, func() bool { return r.Stats().Dispatched >= txs*per }, 60*time.Second, 5*time.Millisecond)
	st := r.Stats()
	t.Logf("%d events in %d batches (%.0f per batch)", st.Dispatched, st.Batches, float64(st.Dispatched)/float64(st.Batches))
	// Handing off whatever was read when the previous batch settled made
	// 182 batches here on a quiet machine, 5-10 times more on a busy one;
	// lingering made 27.
	require.Less(t, st.Batches, int64(120), "batches of %.0f events on average", float64(st.Dispatched)/float64(st.Batches))
}
