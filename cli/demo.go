package cli

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox/internal/demo"
)

func newDemoCmd(g *globals) *cobra.Command {
	var (
		kf      kafkaFlags
		cfg     demo.Config
		sinkURL string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole pipeline end to end and check every invariant",
		Long: `demo runs the seed scenario on the local Postgres (DATABASE_URL or libpq
defaults; with no server answering and initdb on the PATH, a throwaway
cluster) and an embedded Kafka-compatible broker (or --brokers): concurrent
writers place orders, some roll back on a duplicate order id; two relayers
publish; the loyalty consumer awards points idempotently; some events are
forced out a second time. It prints a report and exits 1 if any invariant
fails. It works in a schema of its own and drops it at the end; on a
cluster given by --brokers it deletes the two topics it used and its
consumer group too (their names carry the schema's). --keep keeps them.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg.DatabaseURL = g.databaseURL
			warnLog, err := g.logger()
			if err != nil {
				return err
			}
			if sinkURL != "" && c.Flags().Changed("brokers") {
				return errors.New("--sink and --brokers both name the broker: give one (--sink kafka://host:port is --brokers)")
			}
			sink, cleanup, err := demoSink(sinkURL, &kf, warnLog)
			defer cleanup()
			if err != nil {
				return err
			}
			cfg.Sink = sink
			if sink == nil {
				if cfg.Brokers, err = kf.optionalBrokersConfig(warnLog); err != nil {
					return err
				}
			}
			cfg.Out = g.stdout
			cfg.Progress = true
			cfg.OnConnect = g.logConnected
			if g.logLevel != "info" {
				log, err := g.logger()
				if err != nil {
					return err
				}
				cfg.Logger = log
			}
			rep, err := demo.Run(c.Context(), cfg)
			if err != nil {
				return err
			}
			rep.Print(g.stdout)
			if !rep.OK() {
				return &exitError{code: 1, msg: "demo found broken invariants (see the report above)"}
			}
			return nil
		},
	}
	f := cmd.Flags()
	g.addURLFlag(f)
	kf.register(f)
	f.StringVar(&sinkURL, "sink", "", "run on this broker instead of Kafka: a URL as 'outbox relay --sink' takes (redis://127.0.0.1:6379/0, ...), or webhook (the demo serves the endpoint itself)")
	f.IntVar(&cfg.Orders, "orders", 400, "orders to place")
	f.IntVar(&cfg.Writers, "writers", 8, "concurrent writers")
	f.IntVar(&cfg.DuplicateEvery, "duplicate-every", 10, "every Nth order reuses an order id and rolls back")
	f.IntVar(&cfg.Redeliver, "redeliver", 40, "dispatched events to force out again")
	durationVar(f, &cfg.Timeout, "timeout", 2*time.Minute, "give up after this long")
	f.BoolVar(&cfg.KeepSchema, "keep", false, "keep the demo schema (and, with --brokers, the demo's topics and consumer group) for inspection")
	return cmd
}
