package cli

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox/contracts"
)

// newContractsCmd groups the commands that read an outbox's event
// contracts (package contracts): one file per subcommand.
func newContractsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "contracts",
		Short: "Check and publish the event contracts (JSON Schema per event type and version)",
		Long: `The event contracts are a directory of JSON Schemas, one folder per event
type holding v1.schema.json, v2.schema.json, ... (docs/contracts.md).
Producers, 'outbox relay' and 'outbox consume' read it with --contracts DIR.`,
	}
	cmd.AddCommand(newContractsAsyncAPICmd())
	groupOnly(cmd)
	cmd.AddCommand(newContractsCheckCmd(g))
	return cmd
}

// contractsFlag is --contracts on a command that reads the contracts.
type contractsFlag struct{ dir string }

func (c *contractsFlag) register(f *pflag.FlagSet, what string) {
	f.StringVar(&c.dir, "contracts", "", "directory of the event contracts (one folder per event type, holding v1.schema.json, ...); "+what)
}

// load reads the contracts, or returns nil when --contracts was not given.
func (c *contractsFlag) load() (*contracts.Set, error) {
	if c.dir == "" {
		return nil, nil
	}
	return contracts.Load(c.dir)
}
