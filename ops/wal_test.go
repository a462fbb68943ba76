package ops_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

func TestMain(m *testing.M) { opstest.Main(m) }

// walSetup gives a schema on the logical cluster with the outbox's slot
// and publication created (walrelay.Setup), as a WAL relay leaves them.
func walSetup(t *testing.T) (*pgtest.DB, string) {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6, ServerURL: opstest.NeedLogical(t, "the WAL-mode operations tests")})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	require.NoError(t, walrelay.Setup(context.Background(), db.Pool, db.Tables, slot, slot))
	t.Cleanup(func() { _ = walrelay.Teardown(context.Background(), db.Pool, slot, slot) })
	return db, slot
}

// emitAged commits one event whose created_at is age ago.
func emitAged(t *testing.T, db *pgtest.DB, age time.Duration) int64 {
	t.Helper()
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	var id int64
	require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		id, err = p.Emit(context.Background(), tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"n": 1}})
		if err != nil {
			return err
		}
		_, err = tx.Exec(context.Background(), fmt.Sprintf("UPDATE %s SET created_at = now() - $2::bigint * interval '1 microsecond' WHERE id = $1", db.Tables.OutboxIdent()), id, age.Microseconds())
		return err
	}))
	return id
}

func advanceSlot(t *testing.T, db *pgtest.DB, slot string) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slot)
	require.NoError(t, err)
}

func TestWALSlotWatchdogAndStats(t *testing.T) {
	t.Parallel()
	db, slot := walSetup(t)
	ctx := context.Background()
	for range 5 {
		emitAged(t, db, 0)
	}
	s, found, err := ops.ReadWALSlot(ctx, db.Pool, slot)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "reserved", s.WALStatus)
	require.False(t, s.Active, "no relay reads it")
	require.Positive(t, s.LagBytes, "the inserts are WAL the slot has not confirmed")

	rep, err := ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables, Source: ops.WAL(slot), MaxSlotLagBytes: 1})
	require.NoError(t, err)
	require.False(t, rep.Healthy())
	require.Contains(t, rep.Problems[0], "bytes behind")
	rep, err = ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables, Source: ops.WAL(slot)})
	require.NoError(t, err)
	if !s.InactiveSinceKnown {
		require.True(t, rep.Healthy(), "%v: before PG 17 an inactive slot alone is not a problem (since when is unknown)", rep.Problems)
	}

	st, err := ops.ReadStats(ctx, db.Pool, ops.StatsConfig{Tables: db.Tables, Source: ops.WAL(slot)})
	require.NoError(t, err)
	require.Equal(t, s.Name, st.Slot.Name)
	require.Positive(t, st.TableBytes)

	rep, err = ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables, Source: ops.WAL("outbox_no_such_slot")})
	require.NoError(t, err)
	require.True(t, rep.SlotMissing)
	require.False(t, rep.Healthy())
	_, found, err = ops.ReadWALSlot(ctx, db.Pool, "outbox_no_such_slot")
	require.NoError(t, err)
	require.False(t, found)
}

// Cleanup of a WAL-mode outbox deletes old rows whatever their
// dispatched_at, but only once the slot confirmed a position past their
// commit; young rows, and old rows committed after the horizon, stay.
func TestWALCleanupDeletesOnlyConfirmed(t *testing.T) {
	t.Parallel()
	db, slot := walSetup(t)
	ctx := context.Background()
	var old []int64
	for range 3 {
		old = append(old, emitAged(t, db, 10*24*time.Hour))
	}
	young := emitAged(t, db, 0)
	count := func() int64 {
		var n int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Tables.OutboxIdent()).Scan(&n))
		return n
	}
	cfg := ops.CleanupConfig{Tables: db.Tables, Retention: 24 * time.Hour, Source: ops.WAL(slot), WALConfirmWait: 300 * time.Millisecond, SkipProcessed: true, Logger: opstest.Logger(t)}

	// Nobody reads the slot: it never confirms; nothing is deleted.
	res, err := ops.Cleanup(ctx, db.Pool, cfg)
	require.ErrorIs(t, err, ops.ErrSlotBehind)
	require.Zero(t, res.Outbox.Deleted)
	require.EqualValues(t, 4, count())

	// An old row committed after the horizon was taken is kept, even once
	// the slot is past its commit.
	lsn, xmin, err := ops.WALHorizon(ctx, db.Pool)
	require.NoError(t, err)
	late := emitAged(t, db, 10*24*time.Hour)
	advanceSlot(t, db, slot)
	tc, err := ops.CleanupWALAt(ctx, db.Pool, cfg, lsn, xmin)
	require.NoError(t, err)
	require.EqualValues(t, 3, tc.Deleted, "the three old rows committed before the horizon")
	var left []int64
	rows, err := db.Pool.Query(ctx, "SELECT id FROM "+db.Tables.OutboxIdent()+" ORDER BY id")
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{young, late}, left)

	// The full cleanup, with a reader confirming (here: advancing the
	// slot while it waits), deletes the late row too, and not the young.
	stop := opstest.Start(t, func(ctx context.Context) {
		for ctx.Err() == nil {
			_, _ = db.Pool.Exec(ctx, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slot)
			time.Sleep(20 * time.Millisecond)
		}
	})
	// The horizon is the server's oldest running transaction: another
	// test's, on the same server, can hold it behind the late row for a
	// while, and that run rightly deletes nothing; a later run does.
	cfg.WALConfirmWait = time.Minute
	var deleted int64
	require.Eventually(t, func() bool {
		res, err = ops.Cleanup(ctx, db.Pool, cfg)
		require.NoError(t, err)
		require.NotEmpty(t, res.WALHorizon)
		deleted += res.Outbox.Deleted
		return count() == 1
	}, 30*time.Second, 100*time.Millisecond)
	stop()
	require.EqualValues(t, 1, deleted)
	require.EqualValues(t, 1, count())
	_ = old
}
