// Package bench is the outbox load tool: scenarios that set up their own
// schema on a real Postgres, drive a workload through the library (Emit, the
// relayer, the Kafka publisher, the consumer), and report what they measured
// as a table. `outbox bench` runs them from the command line; BENCHMARKS.md
// holds the figures of one full run and the command that reproduces them.
//
// Every scenario checks its own work (every event drained, counts match)
// and returns an error when something is missing, so the short mode doubles
// as an end-to-end smoke test. Timings are reported, never asserted.
//
//	results, err := bench.Run(ctx, bench.Config{DatabaseURL: url, Short: true}, "relay")
//	for _, r := range results {
//		r.WriteText(os.Stdout)
//	}
package bench
