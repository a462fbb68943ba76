package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/ops"
)

func newPartitionsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "partitions",
		Short: "Make the partitions a partitioned outbox needs ahead (ensure), or list them with what retention would do (list)",
		Long: `A partitioned outbox ('outbox migrate up --partitioned') keeps its rows in
partitions of a fixed number of ids, and an insert whose id has no partition
fails. 'outbox relay' makes them ahead of the id sequence every
--partition-interval and 'outbox cleanup' at its start; 'partitions ensure'
does it now, for cron or before a load test. Retention ('outbox cleanup', the
relay's cleanup job) drops whole partitions once their rows are published
and older than --retention; 'partitions list' shows each partition, what it
holds and why it is or is not due. See docs/partitioning.md.`,
	}
	groupOnly(cmd)
	ensure, list := newPartitionsEnsureCmd(g), newPartitionsListCmd(g)
	for _, c := range []*cobra.Command{ensure, list} {
		g.addDBFlags(c.Flags())
	}
	cmd.AddCommand(ensure, list)
	return cmd
}

func newPartitionsEnsureCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ensure",
		Short: "Make the partitions the outbox needs ahead of its id sequence; exit 1 while the headroom stays low",
		Long: `ensure makes the partitions a partitioned outbox needs ahead of its id
sequence: enough for the settings' ahead (72h by default, 'outbox migrate up
--partitioned --partition-ahead') at the ids drawn per second recently, never
fewer than two partitions' worth, at most 100 per run. Each is one short
transaction; producers and relayers go on. The role must own the outbox
table (or be a member of its owner). It prints what it made and the
headroom, and exits 1 when the headroom is still low (the width is too
narrow for the rate: raise it with 'outbox migrate up --partitioned
--partition-width').`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			pool, t, err := g.opsPool(c.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := ops.EnsurePartitions(c.Context(), pool, ops.PartitionConfig{Tables: t, Logger: log})
			if err != nil {
				return err
			}
			if asJSON {
				err = writeJSON(g, map[string]any{"outbox": t.OutboxIdent(), "created": orEmpty(res.Created), "headroom": headroomJSON(res.Headroom)})
			} else {
				fmt.Fprintf(g.stdout, "%s: made %d %s; %s\n", t.OutboxIdent(), len(res.Created), plural(len(res.Created), "partition", "partitions"), fmtHeadroom(res.Headroom))
			}
			if err == nil && res.Headroom.Low {
				err = &exitError{code: 1, msg: "the partition headroom is still low: " + fmtHeadroom(res.Headroom)}
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for scripts")
	return cmd
}

func newPartitionsListCmd(g *globals) *cobra.Command {
	var (
		asJSON    bool
		retention time.Duration
		slot      string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the partitions of a partitioned outbox: range, rows, pending, newest row, droppable or why not",
		Long: `list prints each partition of a partitioned outbox: its range of ids, Postgres'
estimate of its rows, its pending and held rows (polling source), the
parked rows whose ids fall in it, the created_at of its newest row, and
whether retention with --retention would drop it now or why not. It reads
each partition through the primary key and the pending index, and writes
nothing. For an outbox relayed from the WAL (its slot exists) pending rows
mean nothing: a partition is dropped once the slot confirms it.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			pool, t, err := g.opsPool(c.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			cfg := ops.PartitionListConfig{Tables: t, Retention: retention}
			if ws, found, err := walSlot(c.Context(), pool, t, slot); err != nil {
				return err
			} else if found {
				cfg.Source = ops.WAL(ws.Name)
			}
			infos, h, err := ops.ListPartitions(c.Context(), pool, cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g, map[string]any{"outbox": t.OutboxIdent(), "retention_seconds": retention.Seconds(), "partitions": orEmpty(infos), "headroom": headroomJSON(h)})
			}
			return printPartitions(g.stdout, infos, h, cfg)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON for scripts")
	durationVar(f, &retention, "retention", ops.DefaultRetention, "judge the partitions by this retention (as 'outbox cleanup --retention')")
	f.StringVar(&slot, "slot", "", "the replication slot of an outbox relayed with --mode wal (default outbox_<database>_<table>_<hash>)")
	return cmd
}

func printPartitions(out io.Writer, infos []ops.PartitionInfo, h ops.Headroom, cfg ops.PartitionListConfig) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "PARTITION\tIDS\tROWS (EST.)\tPENDING\tHELD\tPARKED\tNEWEST ROW\tDROPPABLE")
	for _, in := range infos {
		newest := "-"
		if !in.NewestCreatedAt.IsZero() {
			newest = in.NewestCreatedAt.UTC().Format(time.RFC3339)
		}
		verdict := "yes"
		switch {
		case in.Droppable && cfg.Source.IsWAL():
			verdict = "yes, once slot " + cfg.Source.Slot() + " confirms it"
		case !in.Droppable:
			verdict = "no: " + clip.Text(in.Why, 200)
		}
		fmt.Fprintf(w, "%s\t%d-%d\t%d\t%d\t%d\t%d\t%s\t%s\n", in.Name, in.From, in.To-1, max(in.Rows, 0), in.Pending, in.Held, in.Parked, newest, verdict)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "retention %s; %s\n", formatDays(cfg.Retention), fmtHeadroom(h))
	return nil
}

// fmtHeadroom says how far the partitions reach past the id sequence.
func fmtHeadroom(h ops.Headroom) string {
	left := "no ids drawn in the last hour"
	if h.Rate > 0 {
		left = fmt.Sprintf("%s at %.1f ids/s", fmtAge(h.Left), h.Rate)
	}
	low := ""
	if h.Low {
		low = " LOW"
	}
	return fmt.Sprintf("%d partitions of %d ids; headroom%s %d ids past the next id %d (%s; kept at %d, %s ahead)",
		h.Partitions, h.Width, low, h.IDs, h.NextID, left, h.Target, formatDays(h.Ahead))
}

func headroomJSON(h ops.Headroom) map[string]any {
	var left any // null when no id was drawn lately: it lasts for ever
	if h.Rate > 0 {
		left = h.Left.Seconds()
	}
	return map[string]any{
		"next_id": h.NextID, "top": h.Top, "ids": h.IDs, "ids_per_second": h.Rate, "seconds": left,
		"target_ids": h.Target, "low": h.Low, "partitions": h.Partitions, "width": h.Width, "ahead_seconds": h.Ahead.Seconds(),
	}
}

// partitionStatusJSON is a partitioned outbox's part of the stats and
// watchdog JSON; nil (null) for a plain outbox.
func partitionStatusJSON(st *ops.PartitionStatus) any {
	if st == nil {
		return nil
	}
	out := map[string]any{"headroom": headroomJSON(st.Headroom), "last_retention": nil, "problems": orEmpty(st.Problems())}
	if r := st.LastRetention; r != nil {
		out["last_retention"] = map[string]any{"at": timeOrNil(r.At), "retention_seconds": r.Retention.Seconds(), "dropped": orEmpty(r.Dropped), "kept": orEmpty(r.Kept)}
	}
	return out
}

// printPartitionStatus adds a partitioned outbox's lines to stats.
func printPartitionStatus(w io.Writer, st *ops.PartitionStatus) {
	if st == nil {
		return
	}
	fmt.Fprintf(w, "partitions\t%s\n", fmtHeadroom(st.Headroom))
	r := st.LastRetention
	if r == nil {
		fmt.Fprintf(w, "last retention\tnone yet\n")
		return
	}
	fmt.Fprintf(w, "last retention\t%s, %s: dropped %d, kept %d past it\n", r.At.UTC().Format(time.RFC3339), formatDays(r.Retention), len(r.Dropped), len(r.Kept))
	for _, k := range r.Kept {
		fmt.Fprintf(w, "  kept %s\tids %d-%d: %s (%s)\n", k.Name, k.From, k.To-1, k.Reason, oneLine(clip.Text(k.Detail, 200)))
	}
}

// printPartitionCleanup prints what retention did to a partitioned
// outbox's partitions.
func printPartitionCleanup(out io.Writer, name string, cfg ops.CleanupConfig, p *ops.PartitionCleanup) {
	names := func(rs []ops.PartitionRange) string {
		var s []string
		for _, r := range rs {
			s = append(s, r.Name)
		}
		return strings.Join(s, ", ")
	}
	fmt.Fprintf(out, "%s: made %d %s ahead; dropped %d %s older than %s", name, len(p.Ensure.Created), plural(len(p.Ensure.Created), "partition", "partitions"),
		len(p.Dropped), plural(len(p.Dropped), "partition", "partitions"), formatDays(cfg.Retention))
	if len(p.Dropped) > 0 {
		fmt.Fprintf(out, " (%s)", names(p.Dropped))
	}
	fmt.Fprintln(out)
	if len(p.Finished) > 0 {
		fmt.Fprintf(out, "  finished what an earlier cleanup left half done: %s\n", strings.Join(p.Finished, ", "))
	}
	for _, k := range p.Kept {
		fmt.Fprintf(out, "  kept %s (ids %d-%d): %s\n", k.Name, k.From, k.To-1, oneLine(clip.Text(k.Detail, 300)))
	}
	if h := p.Ensure.Headroom; h.Partitions > 0 {
		fmt.Fprintf(out, "  %s\n", fmtHeadroom(h))
	}
}

// orEmpty makes a nil slice an empty one, so that JSON shows [] rather
// than null.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
