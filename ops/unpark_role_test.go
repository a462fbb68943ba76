package ops_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/sqltext"
	"github.com/pgoutbox/outbox/ops"
)

// Unpark writes a row under its old id with requeued_at set, which the
// insert guard refuses from every role but the table's owner and its
// members (migration 7). An operator role that has every privilege unpark
// uses but is not a member gets an error that says so, and the row stays
// parked. Once granted the owner's role, it unparks the row, a row
// written before migration 6 included, whole, under its id. Park and
// replay (a DELETE and an UPDATE) work for the operator role as before.
func TestUnparkNeedsTheTableOwnersRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ids := sqltext.For(db.Tables.Schema, db.Tables.Outbox, db.Tables.Processed)
	tables := ids.Outbox + ", " + ids.Failures + ", " + ids.Parked
	owner, _ := db.Role(t, "GRANT USAGE ON SCHEMA "+ids.Schema+" TO {{role}}",
		"ALTER TABLE "+ids.Outbox+" OWNER TO {{role}}", "ALTER TABLE "+ids.Failures+" OWNER TO {{role}}",
		"ALTER TABLE "+ids.Parked+" OWNER TO {{role}}")
	opName, operator := db.Role(t, "GRANT USAGE ON SCHEMA "+ids.Schema+" TO {{role}}",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON "+tables+" TO {{role}}",
		"GRANT USAGE ON SEQUENCE "+ids.IDSeq+" TO {{role}}")

	// Replay is an UPDATE: the guard does not see it.
	sent := db.InsertRaw(t, uuid.New(), "order.placed", "'{}'", "NULL")
	_, err := db.Pool.Exec(ctx, "UPDATE "+ids.Outbox+" SET dispatched_at = now() WHERE id = $1", sent)
	require.NoError(t, err)
	rep, err := ops.Replay(ctx, operator, ops.ReplayConfig{Tables: db.Tables, FromID: sent, ToID: sent, Apply: true, Logger: opstest.Logger(t)})
	require.NoError(t, err)
	require.EqualValues(t, 1, rep.Rows)

	// A row from before migration 6, with headers the guard's rules refuse.
	legacy := db.InsertLegacy(t, uuid.New(), "order.placed", `'{"n": 1}'`, `'{"retries": 3}'`)
	_, err = ops.Park(ctx, operator, ops.ParkConfig{Tables: db.Tables, ID: legacy, Reason: "poison", Apply: true, Logger: opstest.Logger(t)})
	require.NoError(t, err)

	_, err = ops.Unpark(ctx, operator, ops.UnparkConfig{Tables: db.Tables, ID: legacy, Apply: true, Logger: opstest.Logger(t)})
	require.ErrorContains(t, err, "only the table's owner (or a member of its role) may put a row back")
	d, err := ops.ShowEvent(ctx, db.Pool, ops.ShowConfig{Tables: db.Tables, ID: legacy})
	require.NoError(t, err)
	require.Equal(t, ops.EventParked, d.State, "still parked")

	_, err = db.Pool.Exec(ctx, "GRANT "+pgident.Quote(owner)+" TO "+pgident.Quote(opName))
	require.NoError(t, err)
	res, err := ops.Unpark(ctx, operator, ops.UnparkConfig{Tables: db.Tables, ID: legacy, Apply: true, Logger: opstest.Logger(t)})
	require.NoError(t, err)
	require.True(t, res.Applied)
	d, err = ops.ShowEvent(ctx, db.Pool, ops.ShowConfig{Tables: db.Tables, ID: legacy})
	require.NoError(t, err)
	require.Equal(t, ops.EventPending, d.State)
	require.Equal(t, legacy, d.ID)
	require.JSONEq(t, `{"retries": 3}`, string(d.Headers), "put back whole")
}
