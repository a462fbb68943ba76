package cli

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// stats and watchdog on an outbox with a WAL relay's slot show and check
// the slot, not undispatched rows as pending or stuck.
func TestStatsAndWatchdogOnWALOutbox(t *testing.T) {
	t.Parallel()
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("initdb and pg_ctl are not on the PATH; CI must run this test")
		}
		t.Skip("skipped: needs a throwaway wal_level=logical cluster (initdb/pg_ctl on the PATH)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cluster, err := tmppg.Logical(ctx, 4, nil)
	cancel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	db := pgtest.New(t, pgtest.Options{MaxConns: 4, ServerURL: cluster.URL()})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	require.NoError(t, walrelay.Setup(context.Background(), db.Pool, db.Tables, slot, slot))
	_, err = db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload, created_at) VALUES (gen_random_uuid(), 'order.placed', '{}', now() - interval '1 hour')")
	require.NoError(t, err)

	code, out, errOut := runCLI(t, db, "stats")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "relayed from the WAL")
	require.Contains(t, out, slot)
	require.Contains(t, out, "reserved")
	require.NotContains(t, out, "pending")

	code, out, errOut = runCLI(t, db, "stats", "--json")
	require.Zero(t, code, errOut)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, "wal", st["mode"])

	// Healthy: an hour-old undispatched row is not stuck in WAL mode.
	code, out, errOut = runCLI(t, db, "watchdog")
	require.Zero(t, code, "%s%s", out, errOut)
	require.Contains(t, out, "slot "+slot)
	// Over a 1-byte lag threshold: exit 1.
	code, out, errOut = runCLI(t, db, "watchdog", "--max-slot-lag-bytes", "1", "--json")
	require.Equal(t, 1, code, "%s%s", out, errOut)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, false, rep["healthy"])

	code, _, errOut = runCLI(t, db, "stats", "--slot", "outbox_nope")
	require.NotZero(t, code)
	require.Contains(t, errOut, "no replication slot")
}

// A lost slot has no safe_wal_size, as a slot under an unlimited
// max_slot_wal_keep_size has none: stats says the slot is lost and shows
// the server's real setting, never "unlimited".
func TestStatsOnALostSlotShowsTheSetting(t *testing.T) {
	t.Parallel()
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("initdb and pg_ctl are not on the PATH; CI must run this test")
		}
		t.Skip("skipped: needs a throwaway wal_level=logical cluster (initdb/pg_ctl on the PATH)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cluster, err := tmppg.Logical(ctx, 2, map[string]string{"max_slot_wal_keep_size": "16MB"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	db := pgtest.New(t, pgtest.Options{MaxConns: 4, ServerURL: cluster.URL()})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	require.NoError(t, walrelay.Setup(ctx, db.Pool, db.Tables, slot, slot))

	// Write WAL past the limit and checkpoint until the server gives the
	// slot up.
	status := ""
	for i := 0; i < 20 && status != "lost"; i++ {
		for j := 0; j < 3; j++ {
			_, err = db.Pool.Exec(ctx, "SELECT pg_logical_emit_message(false, 'test', 'x'), pg_switch_wal()")
			require.NoError(t, err)
		}
		_, err = db.Pool.Exec(ctx, "CHECKPOINT")
		require.NoError(t, err)
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status))
	}
	require.Equal(t, "lost", status, "the slot is lost")

	code, out, errOut := runCLI(t, db, "stats")
	t.Logf("outbox stats:\n%s", out)
	require.Zero(t, code, errOut)
	require.Regexp(t, `(?m)^safe wal size\s+none: the slot is lost \(max_slot_wal_keep_size = 16MB\)$`, out)
	require.NotContains(t, out, "unlimited")

	code, out, errOut = runCLI(t, db, "stats", "--json")
	require.Zero(t, code, errOut)
	var st struct {
		Slot struct {
			WALStatus string `json:"wal_status"`
			Keep      string `json:"max_slot_wal_keep_size"`
		} `json:"slot"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, "lost", st.Slot.WALStatus)
	require.Equal(t, "16MB", st.Slot.Keep)
}
