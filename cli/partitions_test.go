package cli_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
)

// The partitioned layout from the command line: migrate up --partitioned
// on a fresh schema (status says so), partitions ensure and list,
// cleanup dropping a due partition, and stats and the watchdog reporting
// the partitions.
func TestPartitionsCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	flags := []string{"--database-url", db.URL, "--schema", db.Tables.Schema}
	run := func(args ...string) (int, string, string) {
		return outbox(t, append(args, flags...)...)
	}
	code, _, stderr := run("migrate", "up", "--partition-width", "100")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "add --partitioned")
	code, out, stderr := run("migrate", "up", "--partitioned", "--partition-width", "100", "--partition-ahead", "1h")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "layout: partitioned, 100 ids a partition, made 1h ahead; 3 partitions")
	code, out, stderr = run("migrate", "status")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "layout: partitioned")

	_, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, created_at, dispatched_at)
		SELECT gen_random_uuid(), 'order.placed', '{}', now() - interval '10 days', now() FROM generate_series(1, 250)`)
	require.NoError(t, err)
	code, out, stderr = run("partitions", "ensure")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "made 2 partitions;", "ids to 499: two widths past the next id, 251")

	code, out, stderr = run("partitions", "list", "--retention", "7d", "--json")
	require.Equal(t, 0, code, stderr)
	var list struct {
		Partitions []struct {
			Partition string `json:"partition"`
			From      int64  `json:"from"`
			Droppable bool   `json:"droppable"`
			Why       string `json:"why"`
		} `json:"partitions"`
		Headroom struct {
			IDs int64 `json:"ids"`
		} `json:"headroom"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Len(t, list.Partitions, 5)
	require.True(t, list.Partitions[0].Droppable)
	require.Equal(t, "ids are still drawn into it", list.Partitions[2].Why)
	require.Equal(t, int64(249), list.Headroom.IDs)

	code, out, stderr = run("cleanup", "--retention", "7d", "--processed-retention", "0")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "dropped 2 partitions older than 7d")

	code, out, stderr = run("stats", "--json")
	require.Equal(t, 0, code, stderr)
	var stats struct {
		Partitions struct {
			LastRetention struct {
				Dropped []any `json:"dropped"`
			} `json:"last_retention"`
		} `json:"partitions"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &stats), out)
	require.Len(t, stats.Partitions.LastRetention.Dropped, 2)
	code, out, stderr = run("watchdog")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "partitions: 3 partitions of 100 ids")
}
