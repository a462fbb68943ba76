package cli

import (
	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox/internal/bench"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// newBenchFloorCmd is `outbox bench floor-reader`, hidden: the steady
// scenario runs it as a process of its own, the cheapest relay of the WAL
// that waits for the broker (bench.RunFloorReader), to measure its CPU per
// event beside pg_recvlogical's. It is a yardstick, not a relay to run.
func newBenchFloorCmd(g *globals) *cobra.Command {
	var (
		kf  kafkaFlags
		cfg bench.FloorReaderConfig
	)
	cmd := &cobra.Command{
		Use:    "floor-reader",
		Short:  "The steady benchmark's floor: read a slot, produce each transaction, wait for its ack (not a relay)",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(c *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			if cfg.Kafka, err = kf.brokersConfig(log); err != nil {
				return err
			}
			cfg.DatabaseURL = g.databaseURL
			return bench.RunFloorReader(c.Context(), cfg)
		},
	}
	f := cmd.Flags()
	g.addURLFlag(f)
	kf.register(f)
	f.StringVar(&cfg.Slot, "slot", "", "the logical replication slot to read (pgoutput)")
	f.StringVar(&cfg.Publication, "publication", "", "the outbox's publication")
	f.StringVar(&cfg.TopicPrefix, "topic-prefix", "", "prefix for every topic name")
	durationVar(f, &cfg.Linger, "linger", walrelay.DefaultLinger, "after a read that took in everything the server sent, wait this long before the next (as relay --linger); 0 produces each transaction as it is read")
	return cmd
}
