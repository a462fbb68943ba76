//go:build linux

package walrelay_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/cputime"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// BenchmarkStreamBesidePgbench measures what the WAL relayer costs while
// it keeps up with a busy outbox, as it runs in production: in a process
// of its own (this one, with its dev broker), the writers elsewhere.
// pgbench runs 8 clients of BEGIN; INSERT INTO orders; INSERT INTO the
// outbox (and, in insert-delete, DELETE it again); COMMIT for 5 s per
// round, with pg_recvlogical reading the slot instead (the least a reader
// costs the server), and with the relayer at several Config.Linger
// values. It reports the business rate, the slot's walsender's CPU per
// event and, for the relayer, this process's CPU per event and events
// per batch:
//
//	PATH=/usr/lib/postgresql/15/bin:$PATH go test -run - -bench StreamBesidePgbench -benchtime 1x -count 3 ./relay/walrelay
func BenchmarkStreamBesidePgbench(b *testing.B) {
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		b.Skip("skipped: pgbench is not on the PATH")
	}
	recv, recvErr := exec.LookPath("pg_recvlogical")
	readers := []struct {
		name   string
		linger time.Duration // 0: pg_recvlogical
	}{{"pg_recvlogical", 0}, {"linger=off", -1}, {"linger=1ms", time.Millisecond}, {"linger=2ms", 2 * time.Millisecond}, {"linger=3ms", 3 * time.Millisecond}}
	for _, mode := range []string{"insert", "insert-delete"} {
		for _, rd := range readers {
			b.Run(mode+"/"+rd.name, func(b *testing.B) {
				if rd.linger == 0 && recvErr != nil {
					b.Skipf("skipped: %v", recvErr)
				}
				for range b.N {
					m := streamBesidePgbench(b, pgbench, recv, mode, rd.linger)
					b.ReportMetric(m.tps, "tx/s")
					b.ReportMetric(float64(m.walsender.Microseconds())/float64(m.events), "walsender_µs/event")
					if rd.linger != 0 {
						b.ReportMetric(float64(m.cpu.Microseconds())/float64(m.events), "cpu_µs/event")
						b.ReportMetric(float64(m.events)/float64(m.batches), "events/batch")
					}
				}
			})
		}
	}
}

// pgbenchRound is what one round measured: pgbench's rate, the events
// committed, and over the round (and the relayer's catch-up) the CPU of
// this process and of the slot's walsender, and the relayer's batches.
type pgbenchRound struct {
	tps            float64
	events         int64
	cpu, walsender time.Duration
	batches        int64
}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+)`)

func streamBesidePgbench(b *testing.B, pgbench, recv, mode string, linger time.Duration) (m pgbenchRound) {
	bu := setup(b)
	ctx := context.Background()
	orders := bu.db.Tables.Schema + ".orders"
	_, err := bu.db.Pool.Exec(ctx, "CREATE TABLE "+orders+" (id bigserial PRIMARY KEY, customer uuid, amount numeric)")
	require.NoError(b, err)
	require.NoError(b, walrelay.Setup(ctx, bu.db.Pool, bu.db.Tables, bu.slot, bu.slot))
	deleteSQL := ""
	if mode == "insert-delete" {
		seq := pgx.Identifier{bu.db.Tables.Schema, bu.db.Tables.Outbox + "_id_seq"}.Sanitize()
		deleteSQL = "DELETE FROM " + bu.db.Tables.OutboxIdent() + " WHERE id = (SELECT currval('" + seq + "'));"
	}
	script := filepath.Join(b.TempDir(), "tx.sql")
	require.NoError(b, os.WriteFile(script, fmt.Appendf(nil, `\set a random(1, 100000)
BEGIN;
INSERT INTO %s (customer, amount) VALUES (md5(:a::text)::uuid, 10);
INSERT INTO %s (aggregate_id, type, payload) VALUES (md5(:a::text)::uuid, 'order.placed', '{"order": 1, "amount": 10, "note": "bench event of a typical size"}');
%s
COMMIT;
`, orders, bu.db.Tables.OutboxIdent(), deleteSQL), 0o600))

	var r *walrelay.Relayer
	if linger == 0 {
		rl := exec.Command(recv, "-d", logical.URL(), "--slot", bu.slot, "--start", "-o", "proto_version=1",
			"-o", "publication_names="+bu.slot, "-o", "messages=true", "-f", "/dev/null")
		require.NoError(b, rl.Start())
		b.Cleanup(func() { _ = rl.Process.Kill(); _ = rl.Wait() })
	} else {
		r = bu.relayer(b, func(c *walrelay.Config) {
			c.StatusInterval = time.Second
			c.Linger = linger
			c.Logger = slog.New(slog.DiscardHandler) // the benchmark's lines stay readable
		})
		run(b, r)
		waitLeading(b, r)
	}
	var pid int
	for start := time.Now(); pid == 0; time.Sleep(10 * time.Millisecond) {
		require.Less(b, time.Since(start), 15*time.Second, "no reader of slot %s", bu.slot)
		require.NoError(b, bu.db.Pool.QueryRow(ctx, "SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1", bu.slot).Scan(&pid))
	}
	w0, c0 := walsenderCPU(b, pid), cputime.Self()
	out, err := exec.Command(pgbench, "-n", "-c", "8", "-j", "2", "-T", "5", "-f", script, logical.URL()).CombinedOutput()
	require.NoError(b, err, string(out))
	tps := tpsLine.FindSubmatch(out)
	require.NotNil(b, tps, string(out))
	m.tps, err = strconv.ParseFloat(string(tps[1]), 64)
	require.NoError(b, err)
	require.NoError(b, bu.db.Pool.QueryRow(ctx, "SELECT last_value FROM "+pgx.Identifier{bu.db.Tables.Schema, bu.db.Tables.Outbox + "_id_seq"}.Sanitize()).Scan(&m.events))
	if r != nil {
		deadline := time.Now().Add(30 * time.Second)
		for r.Stats().Dispatched < m.events {
			require.True(b, time.Now().Before(deadline), "relayed %d of %d", r.Stats().Dispatched, m.events)
			time.Sleep(time.Millisecond)
		}
		m.cpu, m.batches = cputime.Self()-c0, r.Stats().Batches
	}
	m.walsender = walsenderCPU(b, pid) - w0
	return m
}

// walsenderCPU is the slot's walsender's CPU time (a server on this
// machine).
func walsenderCPU(b *testing.B, pid int) time.Duration {
	d, err := cputime.Process(pid)
	require.NoError(b, err, "the walsender's CPU (a server on this machine)")
	return d
}
