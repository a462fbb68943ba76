package cli_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// The printed SQL, run whole by another tool (one Exec, as psql -f), leaves
// a schema every outbox command accepts.
func TestMigratePrintAppliedByAnotherToolIsUpToDate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	names := []string{"--schema", db.Tables.Schema, "--table", "orders_outbox", "--processed-table", "orders_seen"}
	tables := db.Tables
	tables.Outbox, tables.Processed = "orders_outbox", "orders_seen"

	code, script, stderr := outbox(t, append([]string{"migrate", "print"}, names...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, script, "-- outbox migration 1: create_tables (up)\n")
	_, err := db.Pool.Exec(ctx, script)
	require.NoError(t, err, script)

	m, err := migrate.New(tables)
	require.NoError(t, err)
	require.NoError(t, m.Validate(ctx, db.Pool))

	flags := append([]string{"--database-url", db.URL}, names...)
	code, out, stderr := outbox(t, append([]string{"migrate", "status"}, flags...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, fmt.Sprintf("version %d of %d", m.Latest(), m.Latest()))
	require.NotContains(t, out, "pending")
	code, out, stderr = outbox(t, append([]string{"migrate", "up"}, flags...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "is up to date")
}

func TestMigratePrintDownRevertsNewestFirst(t *testing.T) {
	t.Parallel()
	code, out, stderr := outbox(t, "migrate", "print", "--down", "--table", "orders_outbox")
	require.Equal(t, 0, code, stderr)
	m, err := migrate.New(pgtest.DB{}.Tables) // the versions and names are the same for every table
	require.NoError(t, err)
	prev := len(out)
	for _, mg := range m.Migrations() {
		i := strings.Index(out, fmt.Sprintf("-- outbox migration %d: %s (down)\n", mg.Version, mg.Name))
		require.GreaterOrEqual(t, i, 0, "version %d printed", mg.Version)
		require.Less(t, i, prev, "version %d comes before version %d", mg.Version, mg.Version-1)
		prev = i
		require.Contains(t, out, fmt.Sprintf(`DELETE FROM "public"."orders_outbox_migrations" WHERE version = %d;`, mg.Version))
	}
	require.NotContains(t, out, "(up)")

	code, out, _ = outbox(t, "migrate", "print", "--down", "--to", fmt.Sprint(m.Latest()-1))
	require.Equal(t, 0, code)
	require.Contains(t, out, fmt.Sprintf("-- outbox migration %d:", m.Latest()))
	require.NotContains(t, out, fmt.Sprintf("-- outbox migration %d:", m.Latest()-1))

	for _, args := range [][]string{{"--to", "1"}, {"--down", "--from", "1"}, {"--from", "99"}} {
		code, _, stderr = outbox(t, append([]string{"migrate", "print"}, args...)...)
		require.Equal(t, 1, code, args)
		require.NotEmpty(t, stderr)
	}
}

// The help's example of --down --to 2 names the versions the command
// really prints, whatever the number of migrations this binary carries.
func TestMigratePrintHelpNamesTheVersionsItReverts(t *testing.T) {
	t.Parallel()
	code, help, stderr := outbox(t, "migrate", "print", "--help")
	require.Equal(t, 0, code, stderr)
	m := regexp.MustCompile(`outbox migrate print --down --to 2 +revert versions (\d+) to (\d+) \(newest first\)`).FindStringSubmatch(help)
	require.NotNil(t, m, "the help names the versions --down --to 2 reverts:\n%s", help)

	code, out, stderr := outbox(t, "migrate", "print", "--down", "--to", "2")
	require.Equal(t, 0, code, stderr)
	var printed []string
	for _, v := range regexp.MustCompile(`(?m)^-- outbox migration (\d+): `).FindAllStringSubmatch(out, -1) {
		printed = append(printed, v[1])
	}
	require.Equal(t, m[1], printed[0], "the newest version reverted")
	require.Equal(t, m[2], printed[len(printed)-1], "the oldest version reverted")
}

// migrate up --binary-payloads turns the setting on (status says so), and
// down --binary-payloads --yes off; down --to waits for it to be off.
func TestMigrateBinaryPayloads(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	flags := []string{"--database-url", db.URL, "--schema", db.Tables.Schema}
	code, out, stderr := outbox(t, append([]string{"migrate", "status"}, flags...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "binary payloads: off")

	code, out, stderr = outbox(t, append([]string{"migrate", "up", "--binary-payloads"}, flags...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "binary payloads are on")
	code, out, stderr = outbox(t, append([]string{"migrate", "status"}, flags...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "binary payloads: on")

	code, _, stderr = outbox(t, append([]string{"migrate", "down", "--to", "0", "--yes"}, flags...)...)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "migrate down --binary-payloads")
	code, _, stderr = outbox(t, append([]string{"migrate", "down", "--binary-payloads"}, flags...)...)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--yes")

	code, out, stderr = outbox(t, append([]string{"migrate", "down", "--binary-payloads", "--yes"}, flags...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "binary payloads are off")
	code, out, stderr = outbox(t, append([]string{"migrate", "status"}, flags...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "binary payloads: off")
}
