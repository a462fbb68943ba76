package migrate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// requireGuard checks that the outbox table still refuses a chosen id and
// a row the relay cannot publish, naming the outbox table.
func requireGuard(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (id, aggregate_id, type, payload) VALUES (3, gen_random_uuid(), 'order.placed', '{}')")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "428C9", pgErr.Code, "a chosen id is refused")
	err = plainInsert(ctx, db, "bad topic.placed", nil)
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "23514", pgErr.Code)
	require.Equal(t, db.Tables.Outbox+"_type_topic", pgErr.ConstraintName)
	require.Equal(t, db.Tables.Outbox, pgErr.TableName)
}

func countRows(t *testing.T, db *pgtest.DB, where string) (n int64) {
	t.Helper()
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()+" WHERE "+where).Scan(&n))
	return n
}

// Convert makes a plain outbox holding rows the first partition of a
// partitioned one, without copying: the rows keep their ids, the old
// table becomes <outbox>_p0000000000000000000 for ids below the bound,
// partitions follow, the guard still refuses bad inserts; a second run
// does nothing. Revert then puts a plain table back with the pending rows
// only, keeps the partitioned one as <outbox>_retired, and DropRetired
// drops it once it is older than the cutoff.
func TestConvertAndRevertAnOutboxHoldingRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for range 300 {
		require.NoError(t, plainInsert(ctx, db, "order.placed", nil))
	}
	_, err := db.Pool.Exec(ctx, "UPDATE "+db.Tables.OutboxIdent()+" SET dispatched_at = now() WHERE id <= 250")
	require.NoError(t, err)
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	cfg := migrate.MoveConfig{Settings: migrate.PartitionSettings{Width: 100}}

	plan, err := m.PlanMove(ctx, db.Pool, migrate.MoveConvert, cfg)
	require.NoError(t, err)
	require.Len(t, plan, 3)
	require.Contains(t, plan[0], "id < 600", "two widths past id 301, rounded up past it")

	res, err := m.Convert(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Equal(t, []string{migrate.StepBound, migrate.StepValidate, migrate.StepSwap}, res.Done)
	require.Equal(t, migrate.StepDone, res.State.Step)
	require.False(t, res.State.Finished.IsZero())
	require.EqualValues(t, 600, res.State.Bound)

	p, err := m.Partitioning(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPartitioned, p.Layout)
	ps := partitions(t, db)
	require.Equal(t, db.Tables.Outbox+"_p0000000000000000000", ps[0].Name)
	require.EqualValues(t, 0, ps[0].From)
	require.EqualValues(t, 600, ps[0].To)
	require.EqualValues(t, 800, ps[len(ps)-1].To)
	require.EqualValues(t, 300, countRows(t, db, "true"))
	require.EqualValues(t, 50, countRows(t, db, "dispatched_at IS NULL"))
	requireGuard(t, db)
	require.NoError(t, plainInsert(ctx, db, "order.placed", nil))
	require.NoError(t, m.Validate(ctx, db.Pool))

	again, err := m.Convert(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Empty(t, again.Done)

	back, err := m.Revert(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.EqualValues(t, 51, back.Copied)
	require.Equal(t, db.Tables.Outbox+"_retired", back.State.Retired)
	p, err = m.Partitioning(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPlain, p.Layout)
	require.EqualValues(t, 51, countRows(t, db, "dispatched_at IS NULL"))
	require.EqualValues(t, 51, countRows(t, db, "true"))
	requireGuard(t, db)
	require.NoError(t, plainInsert(ctx, db, "order.placed", nil))
	require.NoError(t, m.Validate(ctx, db.Pool))

	_, err = m.Convert(ctx, db.Pool, cfg)
	require.ErrorIs(t, err, migrate.ErrMoveRefused, "the retired table is still there")
	dropped, err := m.DropRetired(ctx, db.Pool, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Empty(t, dropped, "retired within the retention")
	dropped, err = m.DropRetired(ctx, db.Pool, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, db.Tables.Outbox+"_retired", dropped)

	res, err = m.Convert(ctx, db.Pool, cfg)
	require.NoError(t, err, "converts again once the retired table is gone")
	require.Len(t, res.Done, 3)
	requireGuard(t, db)
}
