package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgoutbox/outbox/internal/cputime"
)

// CPU time, beside wall time, for the drains: on a shared machine a
// reader's wall time moves with everyone else's load, its CPU seconds much
// less. The walsender's comes from /proc, so only for a server on this
// machine.

// activePIDSQL is the pid of the process that serves slot $1's reader (the
// walsender), 0 while nobody reads it (catalog view, no index).
const activePIDSQL = `SELECT coalesce((SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1), 0)`

// cpuWatch follows the CPU time of the walsender serving a slot, sampled
// every 20 ms, since it exits with its reader.
type cpuWatch struct {
	stopOnce sync.Once
	done     chan struct{}
	mu       sync.Mutex
	pid      int
	last     time.Duration
}

// watchWalsender starts following slot's walsender once it appears; it
// follows nothing when the server is not on this machine (no walsender
// process under that pid).
func (e *env) watchWalsender(ctx context.Context, slot string) *cpuWatch {
	w := &cpuWatch{done: make(chan struct{})}
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			w.sample(ctx, e, slot)
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *cpuWatch) sample(ctx context.Context, e *env, slot string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pid == 0 {
		pid, err := e.intQuery(ctx, activePIDSQL, slot)
		if err != nil || pid == 0 || !isWalsender(int(pid)) {
			return
		}
		w.pid = int(pid)
	}
	if cpu, err := cputime.Process(w.pid); err == nil {
		w.last = cpu
	}
}

// stop samples once more (while the walsender is still there) and returns
// its CPU time; 0 when it was never seen.
func (w *cpuWatch) stop(ctx context.Context, e *env, slot string) time.Duration {
	w.sample(ctx, e, slot)
	w.stopOnce.Do(func() { close(w.done) })
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// isWalsender reports whether pid is a walsender on this machine.
func isWalsender(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "walsender")
}

// cpuSeconds formats a CPU time, "-" when unknown.
func cpuSeconds(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64)
}
