package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/kafka"
)

// Config says where the scenarios run and how big they are. The zero value
// runs the full-size scenarios against libpq's default server with an
// in-process dev broker.
type Config struct {
	// DatabaseURL is the Postgres server. Every scenario creates its own
	// schema there and drops it when done. Defaults to libpq's defaults
	// (PGHOST, PGUSER, ...).
	DatabaseURL string
	// WALDatabaseURL is a server with wal_level=logical, and a role with
	// REPLICATION, for the wal scenario, which compares the polling relay
	// with the WAL source and pg_recvlogical there, and for the memory
	// scenario's WAL relay. Defaults to a throwaway cluster started for
	// each (internal/tmppg: initdb and pg_ctl on the PATH); the memory
	// scenario skips its WAL part, with a note, when neither is there.
	WALDatabaseURL string
	// Kafka is the broker to publish to. With no Brokers, each run starts
	// an in-process dev broker (devkafka.Start), so the broker's
	// memory does not carry over from one run to the next. Defaults to the
	// dev broker.
	Kafka kafka.ClientConfig
	// Short runs every scenario at a size that finishes in seconds: a smoke
	// test, not a measurement. Defaults to false.
	Short bool
	// Writers is the number of concurrent emitting transactions in the emit
	// and latency scenarios. Defaults to 8.
	Writers int
	// Events is the relay and wal scenarios' preload. Defaults to 200,000 (5,000
	// with Short).
	Events int
	// Aggregates is how many aggregates preloaded events spread over.
	// Defaults to 1,000.
	Aggregates int
	// ScaleRows are the dispatched-row counts the scale scenario measures
	// at, ascending. Defaults to 0, 1M and 10M (0 and 100,000 with Short).
	ScaleRows []int64
	// MemoryEvents is how many events the memory scenario's relay drains
	// and its consumer then processes. Defaults to 1,000,000 (20,000 with
	// Short).
	MemoryEvents int
	// Watermill adds the Watermill forwarder to the relay scenario. It
	// builds and runs the separate module in WatermillDir. Defaults to
	// false; the "watermill" scenario runs it on its own.
	Watermill bool
	// WatermillDir is the bench/watermill module. Defaults to
	// "bench/watermill" (run from the repository root).
	WatermillDir string
	// OutboxCommand returns a command that runs the outbox CLI with args,
	// the subcommand first ("relay", "consume"), for the memory scenario,
	// which measures the relay's and the consumer's peak RSS as processes
	// of their own. Defaults to nil: the memory scenario is skipped with a
	// note.
	OutboxCommand func(ctx context.Context, args ...string) *exec.Cmd
	// CleanupEvents is how many events the cleanup scenario fills each
	// layout's outbox with, spread over 9 days. Defaults to 10,000,000
	// (20,000 with Short).
	CleanupEvents int
	// SteadyRates are the steady scenario's emit rates, events per
	// second. Defaults to 1,000 and 10,000.
	SteadyRates []int
	// SteadySources are the steady scenario's readers, of poll, wal,
	// recvlogical and floor (RunFloorReader). Defaults to all four.
	SteadySources []string
	// SteadyRelayArgs are extra flags for the steady scenario's `outbox
	// relay` processes (both sources), e.g. --busy-poll-interval 4ms, to
	// measure a setting's trade between CPU and latency. Defaults to none.
	SteadyRelayArgs []string
	// SteadyRelayBinary, when set, is the outbox binary the steady
	// scenario runs as its relays instead of OutboxCommand's, to compare
	// two builds under the same load. Defaults to "" (OutboxCommand).
	SteadyRelayBinary string
	// WALParts are the parts of the wal scenario to run, of drain,
	// latency and business. Defaults to all three.
	WALParts []string
	// RelayProfileDir, when set, makes the steady scenario's relay
	// processes write CPU profiles there (`outbox relay --cpuprofile`),
	// one file per run, named after the source. Defaults to "" (none).
	RelayProfileDir string
	// Progress receives one line per step, so a long run shows where it
	// is. Defaults to io.Discard.
	Progress io.Writer
	// Logger receives the library's own logs (relayers, consumers).
	// Defaults to warnings and errors on Progress.
	Logger *slog.Logger
	// OnResult, if set, is called with each scenario's result as soon as
	// it is done.
	OnResult func(Result)
}

func (c Config) withDefaults() Config {
	if c.Writers == 0 {
		c.Writers = 8
	}
	if c.Events == 0 {
		c.Events = pick(c.Short, 5_000, 200_000)
	}
	if c.Aggregates == 0 {
		c.Aggregates = 1_000
	}
	if c.ScaleRows == nil {
		c.ScaleRows = []int64{0, 1_000_000, 10_000_000}
		if c.Short {
			c.ScaleRows = []int64{0, 100_000}
		}
	}
	if c.MemoryEvents == 0 {
		c.MemoryEvents = pick(c.Short, 20_000, 1_000_000)
	}
	if c.CleanupEvents == 0 {
		c.CleanupEvents = pick(c.Short, 20_000, 10_000_000)
	}
	if c.SteadyRates == nil {
		c.SteadyRates = []int{1000, 10000}
	}
	if c.SteadySources == nil {
		c.SteadySources = []string{"recvlogical", "floor", "poll", "wal"}
	}
	if c.WALParts == nil {
		c.WALParts = []string{"drain", "latency", "business"}
	}
	if c.WatermillDir == "" {
		c.WatermillDir = "bench/watermill"
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(c.Progress, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Writers < 1 || c.Writers > 64:
		return fmt.Errorf("bench: %d writers; use 1 to 64 (Postgres allows 100 connections here)", c.Writers)
	case c.Events < 1:
		return fmt.Errorf("bench: %d events; use a positive number", c.Events)
	case c.Aggregates < 1:
		return fmt.Errorf("bench: %d aggregates; use a positive number", c.Aggregates)
	case c.MemoryEvents < 1:
		return fmt.Errorf("bench: %d memory events; use a positive number", c.MemoryEvents)
	case c.CleanupEvents < 1000 || c.CleanupEvents > 1_000_000_000:
		return fmt.Errorf("bench: %d cleanup events; use 1,000 to 1,000,000,000", c.CleanupEvents)
	}
	for _, r := range c.SteadyRates {
		if r < 1 || r > 100_000 {
			return fmt.Errorf("bench: steady rate %d; use 1 to 100,000 events/s", r)
		}
	}
	for _, src := range c.SteadySources {
		if !slices.Contains([]string{"recvlogical", "floor", "poll", "wal"}, src) {
			return fmt.Errorf("bench: steady source %q; use poll, wal, recvlogical or floor", src)
		}
	}
	for _, p := range c.WALParts {
		if !slices.Contains([]string{"drain", "latency", "business"}, p) {
			return fmt.Errorf("bench: wal part %q; use drain, latency or business", p)
		}
	}
	if !slices.IsSorted(c.ScaleRows) || len(c.ScaleRows) == 0 || c.ScaleRows[0] < 0 {
		return fmt.Errorf("bench: scale rows %v; give non-negative counts in ascending order, e.g. 0,1000000,10000000", c.ScaleRows)
	}
	return nil
}

func pick[T any](short bool, s, full T) T {
	if short {
		return s
	}
	return full
}

// Scenario names a workload Run can drive.
type Scenario struct {
	Name, About string
	// Default scenarios run when Run is given no names.
	Default bool
	run     func(ctx context.Context, s *session) (*Result, error)
}

// Scenarios lists every scenario, in the order Run runs them.
func Scenarios() []Scenario {
	return []Scenario{
		{"emit", "business transactions with and without Emit; NOTIFY on/off; EmitBatch vs single emits", true, runEmit},
		{"relay", "drain a preload with 1, 2 and 4 relayers vs the bare claim-and-mark SQL (--watermill adds Watermill)", true, runRelay},
		{"watermill", "drain the same preload with the Watermill forwarder (separate module in bench/watermill)", false, runWatermillScenario},
		{"redis", "drain a preload to a Redis stream (own redis-server) vs go-redis alone; commit-to-ack latency at 1,000 events/s", false, runRedis},
		{"exactlyonce", "the polling relay with --exactly-once vs at-least-once in one run: drain of a preload, and commit-to-visible latency for a read_committed consumer at 1,000 events/s", false, runExactlyOnce},
		{"latency", "commit-to-broker-ack latency at a steady emit rate, LISTEN/NOTIFY and poll-only", true, runLatency},
		{"scale", "claim time and relay throughput with 0, 1M and 10M dispatched rows in the table", true, runScale},
		{"consumer", "idempotent processing throughput, single and batched", true, runConsumer},
		{"wal", "polling relay vs WAL source vs pg_recvlogical on a wal_level=logical cluster: drain, latency, business tx/s per emit mode while relaying, WAL bytes and cleanup per event", false, runWAL},
		{"nats", "drain to NATS JetStream vs nats.go publishing the same messages, and commit-to-ack latency at 1,000 events/s (server: OUTBOX_BENCH_NATS_URL, default nats://127.0.0.1:4222)", false, runNATS},
		{"webhook", "drain to a loopback webhook endpoint vs net/http alone, and commit-to-2xx latency at 1,000 events/s", false, runWebhook},
		{"amqp", "RabbitMQ: drain through amqppub vs amqp091-go alone with the same durability, and commit-to-confirm latency at 1,000 events/s", false, runAMQP},
		{"steady", "CPU per event of `outbox relay` (polling and --mode wal) and of pg_recvlogical, each its own process, under one-event transactions at 1,000 and 10,000/s; commit-to-ack p50/p99; the server's cost (backend CPU, pg_stat_statements) on a throwaway wal_level=logical cluster", false, runSteady},
		{"multi", "one `outbox relay --config` process serving 50 outboxes in 10 databases (created and dropped): RSS, server connections, idle CPU, and one busy outbox's commit-to-ack p99 at 200 events/s with the others idle and with one database unreachable, against a relay of that outbox alone", false, runMulti},
		{"cleanup", "retention keeping 7 of 9 days: batched DELETE on the plain table vs dropping partitions, same rows: the cleanup's WAL, dead tuples, VACUUM after, business p99 during it; the relay's claim with 30 partitions vs 1 (throwaway cluster)", false, runRetention},
		{"memory", "peak RSS of an `outbox relay` process draining 1M events, then of an `outbox consume` process processing them, and of an `outbox relay --mode wal` process streaming 1M events (with its slot lag)", true, runMemory},
	}
}

// Result is what one scenario measured.
type Result struct {
	Scenario string   `json:"scenario"`
	Machine  Machine  `json:"machine"`
	Params   []Param  `json:"params"`
	Tables   []Table  `json:"tables"`
	Targets  []Target `json:"targets,omitempty"`
	// Metrics are the table's key numbers by name, for scripts.
	Metrics map[string]float64 `json:"metrics"`
	Notes   []string           `json:"notes,omitempty"`
	// Elapsed is the scenario's wall time, setup included.
	Elapsed time.Duration `json:"elapsed_ns"`
}

// Param is one parameter of a scenario, as printed.
type Param struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Table is a titled grid of formatted numbers.
type Table struct {
	Title   string     `json:"title"`
	Columns []string   `json:"columns"`
	Rows    [][]string `json:"rows"`
}

// Target is one of the project's performance targets next to what this run
// measured.
type Target struct {
	Name     string `json:"name"`
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

// Machine is where a result was measured.
type Machine struct {
	CPUs       int     `json:"cpus"`
	GOMAXPROCS int     `json:"gomaxprocs"`
	CPUModel   string  `json:"cpu_model,omitempty"`
	GoVersion  string  `json:"go_version"`
	Postgres   string  `json:"postgres"`
	Load1      float64 `json:"load1"`
	Broker     string  `json:"broker"`
}

func (r *Result) param(name string, format string, args ...any) {
	r.Params = append(r.Params, Param{name, fmt.Sprintf(format, args...)})
}

func (r *Result) metric(name string, v float64) {
	if r.Metrics == nil {
		r.Metrics = map[string]float64{}
	}
	r.Metrics[name] = v
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func (r *Result) target(name, goal, measured string, met bool) {
	r.Targets = append(r.Targets, Target{name, goal, measured, met})
}

// session is one Run: the configuration, an admin pool for schema setup,
// and what is known of the machine.
type session struct {
	cfg              Config
	admin            *pgxpool.Pool
	machine          Machine
	warnedCheckpoint bool
}

func (s *session) progress(format string, args ...any) {
	fmt.Fprintf(s.cfg.Progress, "bench: "+format+"\n", args...)
}

// Run runs the named scenarios (all default ones when names is empty), in
// the order Scenarios lists them, and returns their results. A failed
// scenario does not stop the others; the error joins every failure.
func Run(ctx context.Context, cfg Config, names ...string) ([]Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	all := Scenarios()
	want := map[string]bool{}
	for _, n := range names {
		if !slices.ContainsFunc(all, func(s Scenario) bool { return s.Name == n }) {
			var known []string
			for _, s := range all {
				known = append(known, s.Name)
			}
			return nil, fmt.Errorf("bench: unknown scenario %q; pick from %s", n, strings.Join(known, ", "))
		}
		want[n] = true
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("bench: database URL: %w", err)
	}
	pcfg.MaxConns = 4
	admin, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to Postgres: %w", err)
	}
	defer admin.Close()
	s := &session{cfg: cfg, admin: admin}
	if s.machine, err = readMachine(ctx, admin, cfg); err != nil {
		return nil, err
	}

	var results []Result
	var errs []error
	for _, sc := range all {
		if len(want) == 0 && !sc.Default || len(want) > 0 && !want[sc.Name] {
			continue
		}
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		s.progress("scenario %s", sc.Name)
		start := time.Now()
		s.machine.Load1 = load1()
		res, err := sc.run(ctx, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("bench %s: %w", sc.Name, err))
		}
		if res == nil {
			continue
		}
		res.Scenario = sc.Name
		res.Machine = s.machine
		res.Elapsed = time.Since(start)
		if cfg.OnResult != nil {
			cfg.OnResult(*res)
		}
		results = append(results, *res)
	}
	return results, errors.Join(errs...)
}

func readMachine(ctx context.Context, pool *pgxpool.Pool, cfg Config) (Machine, error) {
	m := Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(), CPUModel: cpuModel()}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.QueryRow(qctx, "SHOW server_version").Scan(&m.Postgres); err != nil {
		return m, fmt.Errorf("bench: cannot reach Postgres: %w; is it running? set --database-url or DATABASE_URL", err)
	}
	m.Broker = "in-process dev broker (kfake)"
	if len(cfg.Kafka.Brokers) > 0 {
		m.Broker = strings.Join(cfg.Kafka.Brokers, ",")
	}
	return m, nil
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// load1 is the one-minute load average, so a reader can tell a quiet
// machine's figures from a busy one's.
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	fmt.Sscanf(string(b), "%f", &l)
	return l
}
