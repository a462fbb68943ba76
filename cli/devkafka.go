package cli

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/kafka"
)

func newDevKafkaCmd(g *globals) *cobra.Command {
	var cfg devkafka.Config
	cmd := &cobra.Command{
		Use:   "dev-kafka",
		Short: "Run an embedded Kafka-wire-compatible broker for development (franz-go kfake)",
		Long: `dev-kafka runs a single-node, in-memory (or --data persisted) broker that
speaks the Kafka protocol, with topic auto-creation, until interrupted. Any
Kafka client works against it: outbox relay, kcat, librdkafka, Java. It does
not replicate: use it for development, demos and tests, not production.

--data survives a clean stop only (Ctrl-C, SIGTERM): the broker writes its
list of topics when it stops, so after kill -9, a crash or a power loss the
directory is not usable; delete it and start again.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if cfg.MaxMessageBytes < 0 {
				return fmt.Errorf("--max-message-bytes %d: use a positive size in bytes, or 0 for the default %d", cfg.MaxMessageBytes, kafka.DefaultMaxMessageBytes)
			}
			if cfg.Partitions < 1 {
				return fmt.Errorf("--partitions %d: use a positive number", cfg.Partitions)
			}
			b, err := devkafka.Start(cfg)
			if opErr := (*net.OpError)(nil); errors.As(err, &opErr) {
				return fmt.Errorf("dev broker cannot listen on %s: %w (is another broker running there? pick another --listen port)", cfg.Listen, opErr)
			}
			if err != nil {
				return err
			}
			defer b.Close()
			maxBytes := strconv.Itoa(cfg.MaxMessageBytes)
			if cfg.MaxMessageBytes == 0 {
				maxBytes = fmt.Sprintf("%d (the default)", kafka.DefaultMaxMessageBytes)
			}
			fmt.Fprintf(g.stdout, "dev kafka broker listening on %s (partitions per new topic: %d, message.max.bytes: %s)\n", b.Addr(), cfg.Partitions, maxBytes)
			<-c.Context().Done()
			fmt.Fprintln(g.stdout, "dev kafka broker stopped")
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.Listen, "listen", "127.0.0.1:9092", "host:port to listen on (port 0 picks one)")
	cmd.Flags().IntVar(&cfg.Partitions, "partitions", 6, "partitions of auto-created topics")
	cmd.Flags().StringVar(&cfg.DataDir, "data", "", "directory to persist topics and offsets in across clean stops (not kill -9; default: memory only)")
	cmd.Flags().IntVar(&cfg.MaxMessageBytes, "max-message-bytes", 0, fmt.Sprintf("the broker's message.max.bytes: larger record batches are refused with MESSAGE_TOO_LARGE (0: Kafka's default, %d)", kafka.DefaultMaxMessageBytes))
	return cmd
}
