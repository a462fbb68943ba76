package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox/internal/bench"
)

// benchOptions are the flags of `outbox bench`.
type benchOptions struct {
	kf         kafkaFlags
	cfg        bench.Config
	asJSON     bool
	markdown   bool
	scaleRows  string
	steadyRate string
	cpuProfile string
}

func newBenchCmd(g *globals) *cobra.Command {
	var o benchOptions
	var list strings.Builder
	for _, s := range bench.Scenarios() {
		def := ""
		if !s.Default {
			def = " (not run by default)"
		}
		fmt.Fprintf(&list, "  %-10s %s%s\n", s.Name, s.About, def)
	}
	cmd := &cobra.Command{
		Use:   "bench [scenario...]",
		Short: "Measure emit cost, relay throughput, latency, scale, consumer throughput, relay and consumer memory",
		Long: `bench runs load scenarios against the Postgres server (--database-url or
DATABASE_URL) and prints what it measured. Each scenario creates its own
schema and drops it when done, and starts an in-process dev broker per run
unless --brokers (or KAFKA_BROKERS) names a cluster. With no scenario named,
all default ones run. --short runs every scenario in seconds, as a smoke test.

Scenarios:
` + list.String() + `
The Watermill comparison ('relay --watermill', or the 'watermill' scenario)
builds the separate module in bench/watermill with the go tool: run it from
the repository root, or pass --watermill-dir.

BENCHMARKS.md holds one full run and how to reproduce it.`,
		RunE: func(c *cobra.Command, names []string) error {
			return runBench(c, g, &o, names)
		},
	}
	f := cmd.Flags()
	g.addURLFlag(f)
	o.kf.register(f)
	f.BoolVar(&o.cfg.Short, "short", false, "small sizes: every scenario in seconds (a smoke test; its numbers mean little)")
	f.BoolVar(&o.asJSON, "json", false, "print the results as JSON for scripts (progress still goes to stderr)")
	f.BoolVar(&o.markdown, "markdown", false, "print the results as Markdown tables, as in BENCHMARKS.md")
	f.IntVar(&o.cfg.Writers, "writers", 8, "concurrent emitting transactions (emit, latency, wal) and consumer workers")
	f.IntVar(&o.cfg.Events, "events", 0, "relay and wal scenarios' preload (default 200000; 5000 with --short)")
	f.IntVar(&o.cfg.Aggregates, "aggregates", 1000, "aggregates the preloaded events spread over")
	f.StringVar(&o.scaleRows, "scale-rows", "", "dispatched-row levels of the scale scenario, ascending (default 0,1000000,10000000; 0,100000 with --short)")
	f.StringVar(&o.cfg.WALDatabaseURL, "wal-database-url", "", "server with wal_level=logical (role with REPLICATION) for the wal scenario and the memory scenario's WAL relay (default: a throwaway cluster, needs initdb and pg_ctl; the wal scenario also runs pg_recvlogical, from the PATH or next to initdb)")
	f.IntVar(&o.cfg.MemoryEvents, "memory-events", 0, "events the memory scenario's relay drains, its consumer processes and its WAL relay streams (default 1000000; 20000 with --short)")
	f.BoolVar(&o.cfg.Watermill, "watermill", false, "also drain the relay preload with the Watermill forwarder (builds bench/watermill)")
	f.StringVar(&o.cfg.WatermillDir, "watermill-dir", "bench/watermill", "the bench/watermill module's directory")
	f.IntVar(&o.cfg.CleanupEvents, "cleanup-events", 0, "events the cleanup scenario fills each layout's outbox with, over 9 days (default 10000000; 20000 with --short)")
	f.StringVar(&o.steadyRate, "steady-rates", "", "steady scenario: emit rates in events/s, separated by commas (default 1000,10000)")
	f.StringSliceVar(&o.cfg.SteadySources, "steady-sources", nil, "steady scenario: readers to measure, of recvlogical, floor (the cheapest WAL relay that waits for the broker: a yardstick, not a mode), poll and wal (default all four)")
	f.StringArrayVar(&o.cfg.SteadyRelayArgs, "steady-relay-arg", nil, "steady scenario: an extra flag for its `outbox relay` processes, e.g. --steady-relay-arg=--busy-poll-interval=4ms (repeat for more)")
	f.StringVar(&o.cfg.SteadyRelayBinary, "steady-relay-binary", "", "steady scenario: run this outbox binary as the relays instead of this one, to compare two builds under the same load")
	f.StringSliceVar(&o.cfg.WALParts, "wal-parts", nil, "wal scenario: the parts to run, of drain, latency and business (the 8-writer business transactions in each emit mode; default all three)")
	f.StringVar(&o.cfg.RelayProfileDir, "relay-cpuprofile-dir", "", "steady scenario: each relay process writes a CPU profile into this directory (`outbox relay --cpuprofile`)")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (relayers, broker and bench) to this file")
	cmd.AddCommand(newBenchFloorCmd(g))
	return cmd
}

// runBench runs the scenarios names (all default ones when empty) and
// prints the results as o asks.
func runBench(c *cobra.Command, g *globals, o *benchOptions, names []string) error {
	ctx := c.Context()
	o.cfg.DatabaseURL = g.databaseURL
	warnLog, err := g.logger()
	if err != nil {
		return err
	}
	if o.cfg.Kafka, err = o.kf.optionalBrokersConfig(warnLog); err != nil {
		return err
	}
	o.cfg.Progress = g.stderr
	// Check the database before any scenario, with the connection errors
	// and the "connected to Postgres" line every command gives; the
	// scenarios then open their own pools.
	pool, err := g.connect(ctx, 1)
	if err != nil {
		return err
	}
	pool.Close()
	// The relayers' and consumers' info logs would drown the
	// progress lines; ask for them with --log-level info.
	if !c.Flags().Changed("log-level") {
		g.logLevel = "warn"
	}
	log, err := g.logger()
	if err != nil {
		return err
	}
	o.cfg.Logger = log
	if err := o.parseLists(); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to run the memory scenario's relay and consumer: %w", err)
	}
	o.cfg.OutboxCommand = func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, exe, args...)
	}
	if o.asJSON && o.markdown {
		return fmt.Errorf("--json and --markdown: pick one")
	}
	if !o.asJSON && !o.markdown {
		o.cfg.OnResult = func(r bench.Result) { _ = r.WriteText(g.stdout) }
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	results, runErr := bench.Run(ctx, o.cfg, names...)
	switch {
	case o.asJSON:
		if err := json.NewEncoder(g.stdout).Encode(results); err != nil {
			return err
		}
	case o.markdown:
		bench.WriteMarkdown(g.stdout, results)
	case len(results) > 1:
		fmt.Fprintf(g.stdout, "== all targets (%s)\n", time.Since(start).Round(time.Second))
		if err := bench.WriteTargets(g.stdout, results); err != nil {
			return err
		}
	}
	return runErr
}

// parseLists reads --scale-rows and --steady-rates into the config.
func (o *benchOptions) parseLists() error {
	if o.scaleRows != "" {
		rows, err := parseCounts(o.scaleRows)
		if err != nil {
			return err
		}
		o.cfg.ScaleRows = rows
	}
	if o.steadyRate != "" {
		rates, err := parseCounts(o.steadyRate)
		if err != nil {
			return fmt.Errorf("--steady-rates %q: give rates in events/s separated by commas, e.g. 1000,10000", o.steadyRate)
		}
		for _, r := range rates {
			o.cfg.SteadyRates = append(o.cfg.SteadyRates, int(r))
		}
	}
	return nil
}

func parseCounts(s string) ([]int64, error) {
	var out []int64
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(strings.ReplaceAll(part, "_", ""))
		n, err := strconv.ParseInt(part, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--scale-rows %q: give non-negative row counts separated by commas, e.g. 0,1000000,10000000", s)
		}
		out = append(out, n)
	}
	return out, nil
}
