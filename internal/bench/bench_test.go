package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/cli"
	"github.com/pgoutbox/outbox/internal/bench"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
)

// cliChildEnv makes the test binary act as the outbox CLI, so the memory
// scenario can run `outbox relay` and `outbox consume` as processes of
// their own without a build step.
const cliChildEnv = "OUTBOX_BENCH_TEST_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(cliChildEnv) == "1" {
		os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// logWriter turns progress lines into test logs.
type logWriter struct {
	mu  sync.Mutex
	t   *testing.T
	buf bytes.Buffer
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		w.t.Log(strings.TrimRight(line, "\n"))
	}
}

func shortConfig(t *testing.T) bench.Config {
	return bench.Config{
		DatabaseURL:  pgtest.URL(),
		Short:        true,
		WatermillDir: "../../bench/watermill",
		OutboxCommand: func(ctx context.Context, args ...string) *exec.Cmd {
			cmd := exec.CommandContext(ctx, os.Args[0], args...)
			cmd.Env = append(os.Environ(), cliChildEnv+"=1")
			return cmd
		},
		Progress: &logWriter{t: t},
	}
}

// The --short suite as a CI smoke test: every default scenario runs end to
// end and accounts for every event. Timings are printed, never checked.
func TestShortScenariosDrainEveryEvent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := shortConfig(t)
	results, err := bench.Run(ctx, cfg)
	require.NoError(t, err)

	byName := map[string]bench.Result{}
	for _, r := range results {
		byName[r.Scenario] = r
		var out bytes.Buffer
		require.NoError(t, r.WriteText(&out))
		t.Log("\n" + out.String())
	}
	for _, s := range bench.Scenarios() {
		if s.Default {
			require.Contains(t, byName, s.Name, "scenario %s returned no result", s.Name)
		}
	}

	m := byName["emit"].Metrics
	require.Positive(t, m["emit.transactions"])
	require.Positive(t, m["emit.events"])
	for _, k := range []string{"emit.emit_1k.tx_per_s", "emit.emit_1k_contracts.tx_per_s", "emit.contracts.cost_ratio", "emit.contracts.check_us"} {
		require.Positive(t, m[k], k)
	}

	const events = 5_000 // the relay scenario's short preload
	m = byName["relay"].Metrics
	for _, n := range []int{1, 2, 4} {
		key := fmt.Sprintf("relay.relayers_%d.", n)
		require.EqualValues(t, events, m[key+"dispatched"], "%d relayer(s): dispatched", n)
		require.GreaterOrEqual(t, m[key+"published"], float64(events), "%d relayer(s): records on the broker", n)
	}

	m = byName["latency"].Metrics
	for _, run := range []string{"1000.notify", "1000.poll", "1000.notify_every", "5000.notify", "5000.poll", "5000.notify_every"} {
		require.Positive(t, m["latency."+run+".events"], "latency run %s", run)
	}

	m = byName["scale"].Metrics
	require.EqualValues(t, 5_000, m["scale.0.dispatched"])
	require.EqualValues(t, 5_000, m["scale.100000.dispatched"])

	m = byName["consumer"].Metrics
	for _, run := range []string{"single", "batch_100", "batch_1000", "kafka_single", "kafka_batch"} {
		require.EqualValues(t, 2_000, m["consumer."+run+".processed"], "consumer run %s", run)
	}

	m = byName["memory"].Metrics
	require.EqualValues(t, 20_000, m["memory.events"])
	require.GreaterOrEqual(t, m["memory.published"], float64(20_000))
	require.Positive(t, m["memory.peak_rss_bytes"])
	require.EqualValues(t, 20_000, m["memory.consumer.processed"], "the consumer processed every event once")
	for _, k := range []string{"memory.consumer.idle_rss_bytes", "memory.consumer.rss_bytes", "memory.consumer.peak_rss_bytes", "memory.consumer.events_per_s"} {
		require.Positive(t, m[k], k)
	}
	var targets []string
	for _, tg := range byName["memory"].Targets {
		targets = append(targets, tg.Name)
	}
	require.Contains(t, targets, "consumer RSS under load")
	require.Contains(t, targets, "WAL relay peak RSS streaming 20,000 (backlog + live)")
	if tmppg.Available() {
		require.EqualValues(t, 20_000, m["memory.wal.events"])
		require.GreaterOrEqual(t, m["memory.wal.published"], float64(20_000), "the WAL relay published every event")
		for _, k := range []string{"memory.wal.idle_rss_bytes", "memory.wal.peak_rss_bytes", "memory.wal.sampled_peak_rss_bytes", "memory.wal.events_per_s", "memory.wal.lag_s"} {
			require.Positive(t, m[k], k)
		}
	}
}

// The Watermill comparison builds a separate module with the go tool, which
// downloads Watermill through the module proxy on a fresh machine.
func TestShortWatermillForwardsEveryEvent(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the bench/watermill module (module downloads on a fresh machine)")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go tool is not on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := bench.Run(ctx, shortConfig(t), "watermill")
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.EqualValues(t, 5_000, results[0].Metrics["watermill.events"])
	require.Positive(t, results[0].Metrics["watermill.events_per_s"])
}

func TestRunRejectsUnknownScenario(t *testing.T) {
	t.Parallel()
	_, err := bench.Run(context.Background(), bench.Config{DatabaseURL: pgtest.URL()}, "emitt")
	require.ErrorContains(t, err, `unknown scenario "emitt"`)
	require.ErrorContains(t, err, "emit, relay")
}

// The exactly-once scenario, short: both modes drain every event and every
// committed event becomes visible to a read_committed consumer.
func TestShortExactlyOnceScenario(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := bench.Run(ctx, shortConfig(t), "exactlyonce")
	require.NoError(t, err)
	require.Len(t, results, 1)
	m := results[0].Metrics
	for _, k := range []string{"at_least_once.drain_per_s", "exactly_once.drain_per_s", "at_least_once.visible_p99_ms", "exactly_once.visible_p99_ms"} {
		require.Contains(t, m, k)
	}
	require.Positive(t, m["exactly_once.drain_per_s"])
}
