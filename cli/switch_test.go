package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// The flags of --setup-only and of the switch commands are checked before
// anything connects, each refusal one line.
func TestSwitchAndSetupOnlyFlags(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--setup-only"}, "--slot, --publication, --teardown and --setup-only belong to --mode wal; add --mode wal, or drop them"},
		{[]string{"relay", "--mode", "wal", "--setup-only", "--teardown"}, "--setup-only and --teardown conflict"},
		{[]string{"switch", "to-wal", "--timeout", "0"}, "--timeout 0s: use a positive duration"},
		{[]string{"switch", "to-poll", "--timeout", "-1s"}, "--timeout -1s: use a positive duration"},
		{[]string{"switch", "to-wall"}, `unknown command "to-wall" for "outbox switch"`},
		{[]string{"switch", "to-wal", "--table", "Bad-Name"}, "not a plain identifier"},
		{[]string{"switch", "to-poll", "--database-url", "postgres://u@127.0.0.1:1/x?connect_timeout=2"}, "cannot reach Postgres at 127.0.0.1:1/x as u: connection refused; is Postgres running at 127.0.0.1:1?"},
		{[]string{"relay", "--mode", "wal", "--setup-only", "--database-url", "postgres://u@127.0.0.1:1/x?connect_timeout=2"}, "cannot reach Postgres at 127.0.0.1:1/x as u"},
	}
	for _, tc := range cases {
		var out, errOut strings.Builder
		code := Main(tc.args, &out, &errOut)
		require.Equal(t, 1, code, "%v", tc.args)
		require.Contains(t, errOut.String(), tc.want, "%v", tc.args)
		require.Equal(t, 1, strings.Count(errOut.String(), "outbox: "), "one error line: %q", errOut.String())
		require.Empty(t, out.String(), "%v", tc.args)
	}
	for _, args := range [][]string{{"switch", "to-wal"}, {"switch", "to-poll"}} {
		var out strings.Builder
		require.Zero(t, Main(append(args, "--help"), &out, &out))
		for _, f := range []string{"--database-url", "--schema", "--table", "--slot", "--publication", "--timeout", "--json"} {
			require.Contains(t, out.String(), f, "%v --help", args)
		}
	}
	var out strings.Builder
	require.Zero(t, Main([]string{"relay", "--help"}, &out, &out))
	require.Contains(t, out.String(), "--setup-only")
	require.Zero(t, Main([]string{"--help"}, &out, &out))
	require.Contains(t, out.String(), "switch")
}

// switchCluster starts a throwaway wal_level=logical cluster for the
// switch commands' tests, skipping (failing in CI) when none starts.
func switchCluster(t *testing.T) string {
	t.Helper()
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("initdb and pg_ctl are not on the PATH; CI must run the switch commands' tests")
		}
		t.Skip("skipped: the switch commands' tests need a throwaway wal_level=logical cluster (initdb/pg_ctl on the PATH)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cluster, err := tmppg.Logical(ctx, 10, nil)
	if err != nil && os.Getenv("CI") != "true" {
		t.Skipf("skipped: the switch commands' tests need a throwaway wal_level=logical cluster, and none started: %v", err)
	}
	require.NoError(t, err, "the switch commands' tests need a throwaway wal_level=logical cluster")
	t.Cleanup(func() { _ = cluster.Stop() })
	return cluster.URL()
}

// switchDB is an outbox on the cluster whose slot and publication (the
// defaults), whoever makes them, are dropped when the test ends.
func switchDB(t *testing.T, server string) (*pgtest.DB, string) {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4, ServerURL: server})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil && walrelay.Teardown(ctx, db.Pool, slot, slot) != nil {
			time.Sleep(100 * time.Millisecond)
		}
	})
	return db, slot
}

func TestSwitchCommands(t *testing.T) {
	t.Parallel()
	server := switchCluster(t)

	// --setup-only creates what the relay would, says where the slot
	// starts and what is left for the polling relayers; again, it finds
	// both. The publication is marked: a slot dropped behind the relay's
	// back is reported lost, not silently recreated.
	t.Run("setup-only", func(t *testing.T) {
		t.Parallel()
		db, slot := switchDB(t, server)
		emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 1})
		last := emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 2})
		code, out, errOut := runCLI(t, db, "relay", "--mode", "wal", "--setup-only")
		require.Zero(t, code, errOut)
		require.Contains(t, errOut, "connected to Postgres")
		require.Contains(t, out, "publication "+slot+": created (FOR TABLE "+db.Tables.OutboxIdent()+", inserts only)")
		require.Regexp(t, `replication slot `+slot+`: created at [0-9A-F]+/[0-9A-F]+; every event committed after that position is in it`, out)
		require.Contains(t, out, fmt.Sprintf("2 row(s) up to id %d (the cut) are pending", last))
		require.Contains(t, out, "'outbox switch to-wal' waits for that")
		require.Contains(t, out, "outbox relay --mode wal --schema "+db.Tables.Schema)

		execSQL(t, db, "UPDATE "+db.Tables.OutboxIdent()+" SET dispatched_at = now()")
		code, out, errOut = runCLI(t, db, "relay", "--mode", "wal", "--setup-only")
		require.Zero(t, code, errOut)
		require.Contains(t, out, "publication "+slot+": exists already")
		require.Contains(t, out, "replication slot "+slot+": exists already, at ")
		require.Contains(t, out, fmt.Sprintf("no row up to id %d (the cut) is pending", last))

		execSQL(t, db, "SELECT pg_drop_replication_slot($1)", slot)
		code, _, errOut = runCLI(t, db, "relay", "--mode", "wal", "--setup-only")
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "slot "+slot+" is gone")
		require.Equal(t, 1, strings.Count(errOut, "outbox: "), errOut)
	})

	// to-wal waits for the polling relay to dispatch the rows up to the
	// cut and prints the steps left; --json says the same for scripts.
	t.Run("to-wal", func(t *testing.T) {
		t.Parallel()
		db, slot := switchDB(t, server)
		broker, err := devkafka.Start(devkafka.Config{Partitions: 3})
		require.NoError(t, err)
		t.Cleanup(broker.Close)
		var last int64
		for i := range 30 {
			last = emit(t, db, uuid.New(), "order.placed", map[string]int{"n": i})
		}
		relay := startCommand(t, db, "relay", "--brokers", broker.Addr(), "--poll-interval", "50ms", "--cleanup-interval", "0")
		code, out, errOut := runCLI(t, db, "switch", "to-wal", "--json")
		require.Zero(t, code, errOut)
		require.Zero(t, count(t, db, "dispatched_at IS NULL"))
		var res struct {
			Outbox        string   `json:"outbox"`
			Direction     string   `json:"direction"`
			Slot          string   `json:"slot"`
			SlotCreated   bool     `json:"slot_created"`
			SlotLSN       string   `json:"slot_lsn"`
			Publication   string   `json:"publication"`
			PubCreated    bool     `json:"publication_created"`
			CutID         int64    `json:"cut_id"`
			PendingAtCut  int64    `json:"pending_at_cut"`
			WaitedSeconds *float64 `json:"waited_seconds"`
			NextSteps     []string `json:"next_steps"`
		}
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&res), out)
		require.Equal(t, "to-wal", res.Direction)
		require.Equal(t, slot, res.Slot)
		require.Equal(t, slot, res.Publication)
		require.True(t, res.SlotCreated && res.PubCreated)
		require.Equal(t, last, res.CutID)
		require.LessOrEqual(t, res.PendingAtCut, int64(30))
		require.NotNil(t, res.WaitedSeconds)
		require.Len(t, res.NextSteps, 2)
		require.Contains(t, res.NextSteps[0], "SIGTERM")
		require.Contains(t, res.NextSteps[1], "outbox relay --mode wal --schema "+db.Tables.Schema)
		require.Contains(t, res.NextSteps[1], res.SlotLSN)

		code, out, errOut = runCLI(t, db, "switch", "to-wal")
		require.Zero(t, code, errOut)
		require.Contains(t, out, "publication "+slot+": exists already")
		require.Contains(t, out, fmt.Sprintf("cut: id %d", last))
		require.Contains(t, out, "no row up to the cut was pending: everything the slot lacks is in Kafka")
		require.Contains(t, out, "Next steps (this command stops and starts nothing):\n  1. stop every polling relayer (outbox relay) with SIGTERM")
		require.Contains(t, out, "  2. start the WAL source: outbox relay --mode wal --schema "+db.Tables.Schema)
		require.NoError(t, relay.stop())
	})

	// A held row blocks to-wal: it is logged with what to do, and the
	// command gives up after --timeout, saying so.
	t.Run("to-wal held row", func(t *testing.T) {
		t.Parallel()
		db, _ := switchDB(t, server)
		id := emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 1})
		execSQL(t, db, fmt.Sprintf(`INSERT INTO %s (event_id, aggregate_id, type, reason, error, first_failed_at, failed_at, held_until)
			SELECT id, aggregate_id, type, 'broker_refused', 'INVALID_RECORD', now(), now(), now() + interval '1 hour' FROM %s WHERE id = $1`,
			pgx.Identifier{db.Tables.Schema, db.Tables.Outbox + "_failures"}.Sanitize(), db.Tables.OutboxIdent()), id)
		code, out, errOut := runCLI(t, db, "switch", "to-wal", "--timeout", "1500ms")
		require.Equal(t, 1, code)
		require.Empty(t, out)
		require.Contains(t, errOut, "waiting for the polling relayers to dispatch the rows up to the cut")
		require.Contains(t, errOut, "a held row blocks the switch")
		require.Contains(t, errOut, fmt.Sprintf("id=%d", id))
		require.Contains(t, errOut, "reason=broker_refused")
		last := errOut[strings.LastIndex(errOut, "outbox: "):]
		require.Contains(t, last, fmt.Sprintf("held: %d (broker_refused)", id))
		require.Contains(t, last, "'outbox events retry ID --yes'")
		require.True(t, strings.HasSuffix(last, "(--timeout 1.5s)\n"), last)
	})

	// to-poll marks what the running WAL relayer published and prints
	// the steps left; it refuses when nothing streams the slot.
	t.Run("to-poll", func(t *testing.T) {
		t.Parallel()
		db, slot := switchDB(t, server)
		broker, err := devkafka.Start(devkafka.Config{Partitions: 3})
		require.NoError(t, err)
		t.Cleanup(broker.Close)

		code, _, errOut := runCLI(t, db, "switch", "to-poll")
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "no replication slot "+slot)

		code, _, errOut = runCLI(t, db, "relay", "--mode", "wal", "--setup-only")
		require.Zero(t, code, errOut)
		emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 1})
		began := time.Now()
		code, _, errOut = runCLI(t, db, "switch", "to-poll")
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "no process has read slot "+slot)
		require.Less(t, time.Since(began), 30*time.Second)
		require.Zero(t, count(t, db, "dispatched_at IS NOT NULL"))

		wal := startCommand(t, db, "relay", "--brokers", broker.Addr(), "--mode", "wal", "--cleanup-interval", "0")
		for i := range 4 {
			emit(t, db, uuid.New(), "order.placed", map[string]int{"n": i})
		}
		code, out, errOut := runCLI(t, db, "switch", "to-poll")
		require.Zero(t, code, errOut)
		require.Regexp(t, `marked 5 row\(s\) dispatched: every row committed before WAL position [0-9A-F]+/[0-9A-F]+ \(the cut\), which slot `+slot+` confirmed`, out)
		require.Contains(t, out, "  1. stop every WAL relayer (outbox relay --mode wal) with SIGTERM")
		require.Contains(t, out, "  2. drop the slot and the publication: outbox relay --mode wal --teardown --schema "+db.Tables.Schema)
		require.Contains(t, out, "  3. start the polling relay: outbox relay --schema "+db.Tables.Schema)
		require.Zero(t, count(t, db, "dispatched_at IS NULL"))

		emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 9})
		code, out, errOut = runCLI(t, db, "switch", "to-poll", "--json")
		require.Zero(t, code, errOut)
		var res map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &res), out)
		require.Equal(t, "to-poll", res["direction"])
		require.EqualValues(t, 1, res["marked"])
		require.Equal(t, slot, res["slot"])
		require.NotEmpty(t, res["cut_lsn"])
		require.Len(t, res["next_steps"], 3)

		require.NoError(t, wal.stop())
		code, _, errOut = runCLI(t, db, "relay", "--mode", "wal", "--teardown")
		require.Zero(t, code, errOut)
	})
}
