//go:build linux

package walrelay_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay/walrelay"
)

// BenchmarkStreamBesidePgbench measures what the WAL relayer costs while
// it keeps up with a busy outbox, as it runs in production: in a process
// of its own (this one, with its dev broker), the writers elsewhere.
// pgbench runs 8 clients of BEGIN; INSERT INTO orders; INSERT INTO the
// outbox; COMMIT for 5 s per round, with pg_recvlogical reading the slot
// instead (the least a reader costs the server), and with the relayer at
// several Config.Linger values. It reports the business rate and, for
// the relayer, this process's CPU per event and events per batch:
//
//	PATH=/usr/lib/postgresql/15/bin:$PATH go test -run - -bench StreamBesidePgbench -benchtime 1x ./relay/walrelay
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
	for _, rd := range readers {
		b.Run(rd.name, func(b *testing.B) {
			if rd.linger == 0 && recvErr != nil {
				b.Skipf("skipped: %v", recvErr)
			}
			for range b.N {
				tps, cpu, events, batches := streamBesidePgbench(b, pgbench, recv, rd.linger)
				b.ReportMetric(tps, "tx/s")
				if rd.linger != 0 {
					b.ReportMetric(float64(cpu.Microseconds())/float64(events), "cpu_µs/event")
					b.ReportMetric(float64(events)/float64(batches), "events/batch")
				}
			}
		})
	}
}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+)`)

func streamBesidePgbench(b *testing.B, pgbench, recv string, linger time.Duration) (tps float64, cpu time.Duration, events, batches int64) {
	bu := setup(b)
	ctx := context.Background()
	orders := bu.db.Tables.Schema + ".orders"
	_, err := bu.db.Pool.Exec(ctx, "CREATE TABLE "+orders+" (id bigserial PRIMARY KEY, customer uuid, amount numeric)")
	require.NoError(b, err)
	require.NoError(b, walrelay.Setup(ctx, bu.db.Pool, bu.db.Tables, bu.slot, bu.slot))
	script := filepath.Join(b.TempDir(), "tx.sql")
	require.NoError(b, os.WriteFile(script, fmt.Appendf(nil, `\set a random(1, 100000)
BEGIN;
INSERT INTO %s (customer, amount) VALUES (md5(:a::text)::uuid, 10);
INSERT INTO %s (aggregate_id, type, payload) VALUES (md5(:a::text)::uuid, 'order.placed', '{"order": 1, "amount": 10, "note": "bench event of a typical size"}');
COMMIT;
`, orders, bu.db.Tables.OutboxIdent()), 0o600))

	var r *walrelay.Relayer
	if linger == 0 {
		rl := exec.Command(recv, "-d", logical.URL(), "--slot", bu.slot, "--start", "-o", "proto_version=1",
			"-o", "publication_names="+bu.slot, "-o", "messages=true", "-f", "/dev/null")
		require.NoError(b, rl.Start())
		b.Cleanup(func() { _ = rl.Process.Kill(); _ = rl.Wait() })
		time.Sleep(time.Second) // its stream started
	} else {
		r = bu.relayer(b, func(c *walrelay.Config) { c.StatusInterval = time.Second; c.Linger = linger })
		run(b, r)
		waitLeading(b, r)
	}
	c0 := processCPU()
	out, err := exec.Command(pgbench, "-n", "-c", "8", "-j", "2", "-T", "5", "-f", script, logical.URL()).CombinedOutput()
	require.NoError(b, err, string(out))
	m := tpsLine.FindSubmatch(out)
	require.NotNil(b, m, string(out))
	tps, err = strconv.ParseFloat(string(m[1]), 64)
	require.NoError(b, err)
	if r == nil {
		return tps, 0, 0, 0
	}
	require.NoError(b, bu.db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+bu.db.Tables.OutboxIdent()).Scan(&events))
	deadline := time.Now().Add(30 * time.Second)
	for r.Stats().Published < events {
		require.True(b, time.Now().Before(deadline), "relayed %d of %d", r.Stats().Published, events)
		time.Sleep(time.Millisecond)
	}
	return tps, processCPU() - c0, events, r.Stats().Batches
}

// processCPU is this process's user + system time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
