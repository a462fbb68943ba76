package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// binary is the outbox command, built once for the package.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outbox-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outbox")
	build := exec.Command("go", "build", "-o", binary, "github.com/pgoutbox/outbox/cmd/outbox")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build outbox:", err)
		os.Exit(1)
	}
	code := m.Run()
	stopLogical()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running outbox process.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// start runs `outbox args...` in the background; the process is killed at
// cleanup if still running.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "KAFKA_BROKERS=")
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, out: out, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.done })
	return p
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if sig == syscall.SIGTERM || sig == syscall.SIGINT {
		p.startedUp(t)
	}
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// startedUp waits until p has opened a socket, or has exited. Every
// command these tests stop with SIGTERM connects to Postgres or a broker,
// which it does only after it handles SIGTERM; sent earlier, while the Go
// runtime and the packages are still starting, SIGTERM kills the process
// instead of stopping it (a test that found the outbox already drained
// could stop a relayer it had just started).
func (p *proc) startedUp(t *testing.T) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d", p.cmd.Process.Pid)
	require.Eventually(t, func() bool {
		stat, err := os.ReadFile(dir + "/stat")
		if err != nil {
			return true // gone
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			return true // exited, not yet reaped
		}
		fds, _ := os.ReadDir(dir + "/fd")
		for _, fd := range fds {
			if target, err := os.Readlink(dir + "/fd/" + fd.Name()); err == nil && strings.HasPrefix(target, "socket:") {
				return true
			}
		}
		return false
	}, 60*time.Second, 5*time.Millisecond, "process %d never opened a socket; output:\n%s", p.cmd.Process.Pid, p.out.String())
}

// wait returns the exit code, failing the test after timeout.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		p.done <- nil // let cleanup's receive return
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("process did not exit within %s; output:\n%s", timeout, p.out.String())
		return -1
	}
}

// writers emits n events over aggs aggregates from w goroutines, in
// transactions of batch events, spread over roughly d. It returns the
// committed ids by aggregate.
func writers(t *testing.T, ctx context.Context, db *pgtest.DB, n, aggs, w, batch int, d time.Duration) map[uuid.UUID][]int64 {
	t.Helper()
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	ids := make([]uuid.UUID, aggs)
	for i := range ids {
		ids[i] = uuid.New()
	}
	var (
		mu        sync.Mutex
		committed = map[uuid.UUID][]int64{}
		wg        sync.WaitGroup
	)
	txs := n / batch
	pause := d / time.Duration(max(1, txs/w))
	for g := range w {
		wg.Go(func() {
			for i := g; i < txs; i += w {
				evs := make([]outbox.Event, batch)
				for j := range evs {
					evs[j] = outbox.Event{AggregateID: ids[rand.IntN(aggs)], Type: "order.placed", Payload: map[string]int{"tx": i, "n": j}}
				}
				var got []int64
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					var err error
					got, err = p.EmitBatch(ctx, tx, evs)
					return err
				})
				if err != nil {
					t.Errorf("emit: %v", err)
					return
				}
				mu.Lock()
				for j, id := range got {
					committed[evs[j].AggregateID] = append(committed[evs[j].AggregateID], id)
				}
				mu.Unlock()
				time.Sleep(pause)
			}
		})
	}
	wg.Wait()
	return committed
}

// pending counts undispatched rows.
func pending(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL").Scan(&n))
	return n
}

type delivered struct {
	key       string
	partition int32
	id        int64
	at        time.Time // the record's timestamp: its produce time
	source    string    // the event_source header: which relayer sent it
}

// readTopic reads the whole topic from the start, until at least want
// records were read and none has arrived for a second.
func readTopic(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered {
	t.Helper()
	var out []delivered
	for _, r := range kafkatest.Read(t, addr, timeout, kafkatest.AtLeastThenQuiet(want, time.Second), topic) {
		out = append(out, delivered{key: string(r.Key), partition: r.Partition, id: kafkatest.EventID(r),
			at: r.Timestamp, source: kafkatest.Headers(r)[outbox.HeaderEventSource]})
	}
	return out
}

// verify checks no loss, no invention, per-aggregate order (first
// deliveries ascend within the aggregate's single partition), and returns
// the number of duplicate deliveries.
func verify(t *testing.T, committed map[uuid.UUID][]int64, got []delivered) int {
	t.Helper()
	want := map[int64]uuid.UUID{}
	for agg, ids := range committed {
		for _, id := range ids {
			want[id] = agg
		}
	}
	seen := map[int64]bool{}
	partition := map[string]int32{}
	last := map[string]int64{}
	dups := 0
	for _, d := range got { // one partition's records are in offset order
		agg, ok := want[d.id]
		require.True(t, ok, "event %d was never committed", d.id)
		require.Equal(t, agg.String(), d.key, "event %d has the wrong key", d.id)
		if p, ok := partition[d.key]; ok {
			require.Equal(t, p, d.partition, "aggregate %s in two partitions", d.key)
		}
		partition[d.key] = d.partition
		if seen[d.id] {
			dups++
			continue
		}
		seen[d.id] = true
		require.Greater(t, d.id, last[d.key], "aggregate %s: event %d first delivered after %d", d.key, d.id, last[d.key])
		last[d.key] = d.id
	}
	require.Len(t, seen, len(want), "every committed event delivered")
	return dups
}

// freeAddr returns a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func waitListening(t *testing.T, addr string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "nothing listens on %s", addr)
}

// metric reads one unlabelled (or summed) sample from a /metrics page.
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	sum, found := 0.0, false
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		require.NoError(t, err, line)
		sum += v
		found = true
	}
	require.True(t, found, "metric %s not served", name)
	return sum
}
