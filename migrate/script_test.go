package migrate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// A team that applies the schema with its own tool runs the scripts
// instead of Up and Down; the migrator must then see the same versions as
// if it had run them itself, both ways.
func TestScriptsAppliedByAnotherToolAgreeWithTheMigrator(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	tables := outbox.Tables{Schema: db.Tables.Schema, Outbox: "orders_outbox", Processed: "orders_seen"}.WithDefaults()
	m, err := migrate.New(tables)
	require.NoError(t, err)

	// The whole script in one Exec, as psql -f runs it.
	var up strings.Builder
	require.NoError(t, m.UpScript(&up, 0))
	_, err = db.Pool.Exec(ctx, up.String())
	require.NoError(t, err, up.String())
	require.NoError(t, m.Validate(ctx, db.Pool))
	for _, table := range []string{tables.OutboxIdent(), tables.ProcessedIdent(), migrate.FailuresIdent(tables), migrate.ParkedIdent(tables)} {
		require.True(t, tableExists(t, db, table), table)
	}
	var emitFn bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT to_regprocedure($1) IS NOT NULL", `"`+tables.Schema+`".orders_outbox_emit(uuid, text, jsonb, jsonb)`).Scan(&emitFn))
	require.True(t, emitFn, "migration 5's function is named after the table")
	applied, err := m.Up(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, applied, "the script recorded every version")

	// An upgrade from a version the migrator left.
	reverted, err := m.Down(ctx, db.Pool, 2)
	require.NoError(t, err)
	var want []int
	for v := m.Latest(); v > 2; v-- {
		want = append(want, v)
	}
	require.Equal(t, want, reverted)
	var upgrade strings.Builder
	require.NoError(t, m.UpScript(&upgrade, 2))
	require.NotContains(t, upgrade.String(), "migration 2:")
	_, err = db.Pool.Exec(ctx, upgrade.String())
	require.NoError(t, err, upgrade.String())
	require.NoError(t, m.Validate(ctx, db.Pool))

	var down strings.Builder
	require.NoError(t, m.DownScript(&down, 0))
	_, err = db.Pool.Exec(ctx, down.String())
	require.NoError(t, err, down.String())
	st, err := m.Status(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, 0, st.Current)
	require.False(t, tableExists(t, db, tables.OutboxIdent()))
	require.False(t, tableExists(t, db, tables.ProcessedIdent()))
}

func TestScriptsNameEachMigrationInTheOrderTheyRun(t *testing.T) {
	t.Parallel()
	m, err := migrate.New(outbox.Tables{Schema: "app", Outbox: "orders_outbox"})
	require.NoError(t, err)
	migs := m.Migrations()
	require.Len(t, migs, m.Latest())

	var up, down strings.Builder
	require.NoError(t, m.UpScript(&up, 0))
	require.NoError(t, m.DownScript(&down, 0))
	lastUp, lastDown := -1, len(down.String())
	for _, mg := range migs {
		require.NotContains(t, mg.UpSQL(), "{{", "rendered")
		require.Contains(t, up.String(), mg.UpSQL())
		require.Contains(t, down.String(), mg.DownSQL())

		i := strings.Index(up.String(), fmt.Sprintf("-- outbox migration %d: %s (up)\n", mg.Version, mg.Name))
		require.Greater(t, i, lastUp, "up migrations run oldest first")
		lastUp = i
		rec := fmt.Sprintf(`INSERT INTO "app"."orders_outbox_migrations" (version) VALUES (%d);`, mg.Version)
		require.Greater(t, strings.Index(up.String(), rec), i+len(mg.UpSQL()), "recorded after it is applied")

		j := strings.Index(down.String(), fmt.Sprintf("-- outbox migration %d: %s (down)\n", mg.Version, mg.Name))
		require.GreaterOrEqual(t, j, 0)
		require.Less(t, j, lastDown, "down migrations run newest first")
		lastDown = j
		require.Contains(t, down.String(), fmt.Sprintf(`DELETE FROM "app"."orders_outbox_migrations" WHERE version = %d;`, mg.Version))
	}
	require.Contains(t, up.String(), `CREATE TABLE IF NOT EXISTS "app"."orders_outbox_migrations"`)

	var none strings.Builder
	require.NoError(t, m.UpScript(&none, m.Latest()))
	require.Contains(t, none.String(), "nothing to apply")
	require.NotContains(t, none.String(), "CREATE")
	require.ErrorContains(t, m.UpScript(&none, m.Latest()+1), "out of range")
	require.ErrorContains(t, m.DownScript(&none, -1), "out of range")
}
