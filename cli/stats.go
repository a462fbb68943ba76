package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox/ops"
)

func newStatsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show pending events, the oldest pending event's age (lag) and the dispatch rate",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			t, err := g.tables()
			if err != nil {
				return err
			}
			pool, err := g.connect(c.Context(), 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			s, err := ops.ReadStats(c.Context(), pool, t)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(g.stdout).Encode(s)
			}
			w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(w, "outbox\t%s\n", t.OutboxIdent())
			fmt.Fprintf(w, "pending\t%d\n", s.Pending)
			fmt.Fprintf(w, "oldest pending age\t%s\n", s.OldestPendingAge.Round(time.Millisecond))
			fmt.Fprintf(w, "dispatched last minute\t%d\n", s.DispatchedLastMinute)
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for scripts")
	return cmd
}
