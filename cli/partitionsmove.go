package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/migrate"
)

// newPartitionsMoveCmd is 'partitions convert' (direction
// migrate.MoveConvert) or 'partitions revert'.
func newPartitionsMoveCmd(g *globals, direction string) *cobra.Command {
	var (
		asJSON, dryRun bool
		cfg            migrate.MoveConfig
	)
	cmd := &cobra.Command{Args: cobra.NoArgs}
	if direction == migrate.MoveConvert {
		cmd.Use = "convert"
		cmd.Short = "Move a plain outbox that holds rows into the partitioned layout, online, without copying it"
		cmd.Long = `convert makes a plain outbox table, however many rows it holds, the first
partition of a partitioned table that takes its name, while producers write
and relayers of either source run. Three steps, each its own transaction:
a CHECK bounding the table's ids (an instant's ACCESS EXCLUSIVE), one scan
that validates it (SHARE UPDATE EXCLUSIVE: writes go on), and the swap (an
ACCESS EXCLUSIVE of milliseconds, waiting at most 2s for the transactions in
flight and retried). No row is copied; the old table is dropped by retention
like any partition once its ids are past and its rows older than the
retention. Run it again after an interruption: it goes on from where the
table stands. --dry-run prints the steps. See docs/partitioning.md.`
		addPartitionFlags(cmd.Flags(), &cfg.Settings)
		cmd.Flags().Int64Var(&cfg.Headroom, "headroom", 0, "ids left between the id sequence and the old table's bound until the swap; inserts past it fail (default two partition widths)")
	} else {
		cmd.Use = "revert"
		cmd.Short = "Move a partitioned outbox back to the plain layout, online; the partitioned table is kept until the retention has passed"
		cmd.Long = `revert puts a plain table under the outbox's name in one short transaction
(ACCESS EXCLUSIVE for as long as copying the pending rows takes, waiting at
most 2s for the transactions in flight and retried), while producers write
and relayers run: the pending rows are copied with their ids (none when the
outbox is published, for the WAL source: the WAL holds them), and the
partitioned table is kept as <table>_retired, which 'outbox cleanup' drops
once the retention has passed. --dry-run prints what it would do. See
docs/partitioning.md.`
		cmd.Flags().Int64Var(&cfg.MaxCopy, "max-copy", 0, "refuse when more rows than this are pending (default 100000): they are copied under the lock")
	}
	cmd.RunE = func(c *cobra.Command, _ []string) error {
		log, err := g.logger()
		if err != nil {
			return err
		}
		cfg.Logger = log
		m, pool, err := g.migrator(c)
		if err != nil {
			return err
		}
		defer pool.Close()
		t, _ := g.tables()
		if dryRun {
			return printMovePlan(c.Context(), g, m, pool, t, direction, cfg, asJSON)
		}
		run := m.Convert
		if direction == migrate.MoveRevert {
			run = m.Revert
		}
		res, err := run(c.Context(), pool, cfg)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSON(g, map[string]any{"outbox": t.OutboxIdent(), "done": orEmpty(res.Done), "copied": res.Copied, "move": res.State})
		}
		fmt.Fprintf(g.stdout, "%s: %s finished (steps run now: %v", t.OutboxIdent(), direction, res.Done)
		if direction == migrate.MoveRevert {
			fmt.Fprintf(g.stdout, "; %d pending rows copied; %s is kept until cleanup drops it after the retention", res.Copied, res.State.Retired)
		}
		fmt.Fprintln(g.stdout, ")")
		return nil
	}
	f := cmd.Flags()
	f.BoolVar(&dryRun, "dry-run", false, "print the steps from where the table stands, change nothing")
	f.BoolVar(&asJSON, "json", false, "print JSON for scripts")
	return cmd
}

func printMovePlan(ctx context.Context, g *globals, m *migrate.Migrator, db outbox.DB, t outbox.Tables, direction string, cfg migrate.MoveConfig, asJSON bool) error {
	steps, err := m.PlanMove(ctx, db, direction, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(g, map[string]any{"outbox": t.OutboxIdent(), "direction": direction, "steps": steps})
	}
	for i, s := range steps {
		fmt.Fprintf(g.stdout, "%d. %s\n", i+1, s)
	}
	return nil
}

// printMove prints the record of the outbox's last layout move, if any.
func printMove(ctx context.Context, g *globals, m *migrate.Migrator, db outbox.DB) error {
	st, found, err := m.ReadMove(ctx, db)
	if err != nil || !found {
		return err
	}
	state := "finished " + st.Finished.Format("2006-01-02 15:04:05 MST")
	if st.Finished.IsZero() {
		state = "UNFINISHED at step " + st.Step + " (run 'outbox partitions " + st.Direction + "' again)"
	}
	fmt.Fprintf(g.stdout, "  layout move: %s began %s, %s\n", st.Direction, st.StartedAt.Format("2006-01-02 15:04:05 MST"), state)
	if st.Retired != "" {
		fmt.Fprintf(g.stdout, "  retired table: %s (since %s; 'outbox cleanup' drops it after the retention)\n", st.Retired, st.RetiredAt.Format("2006-01-02 15:04:05 MST"))
	}
	return nil
}
