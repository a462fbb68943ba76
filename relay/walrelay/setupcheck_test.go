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

// emitCommitted emits n events, one transaction each, and returns their ids.
func (b *bundle) emitCommitted(t *testing.T, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	ids := make([]int64, 0, n)
	for i := range n {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			id, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"n": i}})
			ids = append(ids, id)
			return err
		}))
	}
	return ids
}

// slotAndPublication reports whether the bundle's slot and publication
// exist.
func (b *bundle) slotAndPublication(t *testing.T) (slot, publication bool) {
	t.Helper()
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT
		EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1),
		EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, b.slot).Scan(&slot, &publication))
	return slot, publication
}

// Rows committed and left pending before the WAL source's first start are
// older than its slot, so it would never publish them: Setup refuses, says
// how many and what to do, and leaves nothing behind, so that the next run
// checks again. Once they are dispatched it goes on.
func TestSetupRefusesPendingEventsOlderThanTheSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ids := b.emitCommitted(t, 3)

	err := walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot)
	require.ErrorIs(t, err, walrelay.ErrPendingBeforeSlot)
	require.ErrorContains(t, err, fmt.Sprintf("3 event(s) of %s, ids %d to %d", b.db.Tables.OutboxIdent(), ids[0], ids[2]))
	require.ErrorContains(t, err, "outbox switch to-wal")
	slot, pub := b.slotAndPublication(t)
	require.False(t, slot, "the refused slot was left behind")
	require.False(t, pub, "the publication created for the refused slot was left behind")

	_, err = b.db.Pool.Exec(ctx, `UPDATE `+b.db.Tables.OutboxIdent()+` SET dispatched_at = now()`)
	require.NoError(t, err)
	require.NoError(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
	slot, pub = b.slotAndPublication(t)
	require.True(t, slot && pub)
}

// A publication that was there before Setup is not Setup's to drop when it
// refuses; the slot it created is.
func TestSetupRefusingKeepsAPublicationItDidNotCreate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `CREATE PUBLICATION `+b.slot+` FOR TABLE `+b.db.Tables.OutboxIdent()+` WITH (publish = 'insert')`)
	require.NoError(t, err)
	b.emitCommitted(t, 1)

	require.ErrorIs(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot), walrelay.ErrPendingBeforeSlot)
	slot, pub := b.slotAndPublication(t)
	require.False(t, slot)
	require.True(t, pub)
}

// A transaction open when the slot's creation starts is waited for; if it
// commits an event then, that event is before the slot's starting point
// and not in it, and Setup counts it.
func TestSetupRefusesAnEventCommittedWhileTheSlotIsCreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	id, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"n": 1}})
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot) }()
	// The slot shows in pg_replication_slots while its creation waits
	// for this transaction.
	for {
		var creating bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, b.slot).Scan(&creating))
		if creating {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Setup returned before the open transaction ended: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	require.NoError(t, tx.Commit(ctx))

	err = <-done
	require.ErrorIs(t, err, walrelay.ErrPendingBeforeSlot)
	require.ErrorContains(t, err, fmt.Sprintf("1 event(s) of %s, ids %d to %d", b.db.Tables.OutboxIdent(), id, id))
	slot, pub := b.slotAndPublication(t)
	require.False(t, slot || pub)
}

// SetupAllowPending, for a switch from the polling relay, creates the slot
// whatever is pending: the polling relayers publish it.
func TestSetupAllowPendingCreatesTheSlotOverPendingRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.emitCommitted(t, 2)
	require.NoError(t, walrelay.SetupAllowPending(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
	slot, pub := b.slotAndPublication(t)
	require.True(t, slot && pub)
	// Created and marked: Setup takes it as checked, as the WAL relay
	// started after the switch does.
	require.NoError(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
}

// A slot a Setup created but did not live to check (the publication still
// says it is being created) is created again and checked.
func TestSetupChecksASlotAnInterruptedSetupLeft(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.emitCommitted(t, 1)
	require.NoError(t, walrelay.SetupAllowPending(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
	_, err := b.db.Pool.Exec(ctx, `COMMENT ON PUBLICATION `+b.slot+` IS '`+walrelay.CreatingMarker(b.slot)+`'`)
	require.NoError(t, err)

	require.ErrorIs(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot), walrelay.ErrPendingBeforeSlot)
	slot, _ := b.slotAndPublication(t)
	require.False(t, slot, "the unchecked slot was kept")
}

// The relayer stops with the error rather than standing by and trying
// again: nothing changes until an operator acts.
func TestRunStopsOnPendingEventsOlderThanTheSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.emitCommitted(t, 1)
	r := b.relayer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := r.Run(ctx)
	require.ErrorIs(t, err, walrelay.ErrPendingBeforeSlot)
	require.NoError(t, ctx.Err(), "Run kept trying until the test's deadline")
}
