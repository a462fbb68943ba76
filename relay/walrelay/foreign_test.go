package walrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// An insert the stream reports under a relation that is not the outbox
// (another table was in the publication while it was written, and left
// it again) is never skipped: the relayer stops with ErrNotThisOutbox
// naming the table and saying what to do, and acknowledges nothing from
// that transaction on, so the event written with it and the ones after
// stay in the slot.
func TestAnInsertOfAnotherTableStopsTheRelayer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	require.NoError(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
	emit := func(tx pgx.Tx) int64 {
		id, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"n": 1}})
		require.NoError(t, err)
		return id
	}
	var first int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { first = emit(tx); return nil }))

	other := pgx.Identifier{b.db.Tables.Schema, "events_outbox_partitioned"}.Sanitize()
	_, err := b.db.Pool.Exec(ctx, "CREATE TABLE "+other+" (LIKE "+b.db.Tables.OutboxIdent()+" INCLUDING DEFAULTS)")
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, "ALTER PUBLICATION "+pgx.Identifier{b.slot}.Sanitize()+" ADD TABLE "+other)
	require.NoError(t, err)
	var before string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&before))
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+other+" (id, aggregate_id, type, payload) VALUES (1, gen_random_uuid(), 'order.placed', '{}')")
		require.NoError(t, err)
		emit(tx)
		return nil
	}))
	_, err = b.db.Pool.Exec(ctx, "ALTER PUBLICATION "+pgx.Identifier{b.slot}.Sanitize()+" DROP TABLE "+other)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { emit(tx); return nil }))

	err = runOnce(t, b)
	require.ErrorIs(t, err, walrelay.ErrNotThisOutbox)
	require.ErrorContains(t, err, b.db.Tables.Schema+".events_outbox_partitioned, which is not the outbox table")
	require.ErrorContains(t, err, "outbox switch to-poll")

	// The event before may or may not have gone out before the stop;
	// none after it did.
	for _, r := range kafkatest.Read(t, b.broker.Addr(), 10*time.Second, kafkatest.AtLeastThenQuiet(0, time.Second), "order") {
		require.Equal(t, first, kafkatest.EventID(r), "an event at or after the other table's insert was published")
	}
	var behind bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn <= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, b.slot, before).Scan(&behind))
	require.True(t, behind, "the slot was acknowledged past the transaction with the other table's insert")
}
