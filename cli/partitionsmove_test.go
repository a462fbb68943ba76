package cli_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
)

// partitions convert and revert from the command line, on a plain outbox
// holding rows: --dry-run prints the steps and changes nothing, convert
// runs them, migrate status shows the move, revert puts a plain table
// back with the pending rows, and cleanup drops the retired table once
// the retention has passed.
func TestPartitionsConvertAndRevertCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	flags := []string{"--database-url", db.URL, "--schema", db.Tables.Schema}
	run := func(args ...string) (int, string, string) {
		return outbox(t, append(args, flags...)...)
	}
	_, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, created_at, dispatched_at)
		SELECT gen_random_uuid(), 'order.placed', '{}', now() - interval '10 days', CASE WHEN g <= 240 THEN now() END FROM generate_series(1, 250) g`)
	require.NoError(t, err)

	code, out, stderr := run("partitions", "convert", "--partition-width", "100", "--dry-run")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "1. bound: ADD CONSTRAINT partition_bounds CHECK (id >= 0 AND id < 500) NOT VALID")
	require.Contains(t, out, "2. validate:")
	require.Contains(t, out, "3. swap:")
	code, out, _ = run("migrate", "status")
	require.Equal(t, 0, code)
	require.Contains(t, out, "layout: plain")
	require.NotContains(t, out, "layout move")

	code, out, stderr = run("partitions", "convert", "--partition-width", "100")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "convert finished (steps run now: [bound validate swap])")
	code, out, _ = run("migrate", "status")
	require.Equal(t, 0, code)
	require.Contains(t, out, "layout: partitioned, 100 ids a partition")
	require.Contains(t, out, "layout move: convert began")
	code, out, stderr = run("partitions", "list")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, db.Tables.Outbox+"_p0000000000000000000")

	code, out, stderr = run("partitions", "revert", "--dry-run")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "with its 10 pending rows copied")
	code, out, stderr = run("partitions", "revert")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "10 pending rows copied; "+db.Tables.Outbox+"_retired is kept")
	code, out, _ = run("migrate", "status")
	require.Equal(t, 0, code)
	require.Contains(t, out, "layout: plain")
	require.Contains(t, out, "retired table: "+db.Tables.Outbox+"_retired")

	code, _, stderr = run("cleanup")
	require.Equal(t, 0, code, stderr)
	var exists bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", db.Tables.Schema+"."+db.Tables.Outbox+"_retired").Scan(&exists))
	require.True(t, exists, "kept within the retention")
	_, err = db.Pool.Exec(ctx, "UPDATE "+db.Tables.Schema+"."+db.Tables.Outbox+"_layout_move SET retired_at = now() - interval '8 days'")
	require.NoError(t, err)
	code, _, stderr = run("cleanup")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", db.Tables.Schema+"."+db.Tables.Outbox+"_retired").Scan(&exists))
	require.False(t, exists, "cleanup dropped the retired table")
	code, out, _ = run("migrate", "status")
	require.Equal(t, 0, code)
	require.NotContains(t, out, "retired table")
}
