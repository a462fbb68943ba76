package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/ops"
)

func newWatchdogCmd(g *globals) *cobra.Command {
	var (
		cfg    ops.WatchdogConfig
		slot   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "watchdog",
		Short: "List stuck outbox rows and check the lag SLO; exit 1 when unhealthy (for cron and probes)",
		Long: `watchdog checks one outbox table once:

  - rows pending longer than --stuck-after are stuck, and so, whatever their
    age, are held rows (a relayer recorded a permanent failure: the broker
    refused the row, or the relayer could not decode it) and the rows of their
    aggregates waiting behind them: they are listed with
    id, aggregate, type, age, the row they wait behind (rows of one aggregate
    are published in order, so one stuck row holds up the rest of its
    aggregate), and for held rows the reason, the error, the attempts and
    when a relayer tries again;
  - the lag (age of the oldest pending row) must stay under --max-lag.

It exits 0 when healthy and 1 when a row is stuck or the lag is over the SLO,
so it drops into cron or a Kubernetes probe. --json prints the report for
scripts (the exit code is the same).

A held row stays until it is published: fix the cause and run 'outbox events
retry ID --yes', or 'outbox events park ID --reason ... --yes' to let the rest
of its aggregate go (see 'outbox events --help'). A row that waits behind
another ("WAITS FOR") is held up by that row: look at it first. A stuck row
with neither was never refused by a relayer: check that one is running
('outbox stats' shows the dispatch rate) and its logs.

An outbox relayed from the WAL ('outbox relay --mode wal') never marks rows
dispatched, so when its replication slot exists (outbox_<database>_<table>_<hash> by default,
or --slot) the watchdog checks the slot instead: unhealthy when it is more
than --max-slot-lag-bytes behind, when its wal_status is lost (events may
be missing) or unreserved (about to be lost), or when it has had no reader
for longer than --max-slot-inactive (PG 17+ only: older servers do not
record since when a slot is inactive; the lag threshold catches a relay
that stays away while the database writes).`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if cfg.StuckAfter <= 0 || cfg.MaxLag <= 0 {
				return fmt.Errorf("--stuck-after (%s) and --max-lag (%s) must be positive durations, e.g. 5m and 5s", cfg.StuckAfter, cfg.MaxLag)
			}
			if cfg.Limit <= 0 {
				return fmt.Errorf("--limit %d: list at least one row", cfg.Limit)
			}
			pool, t, err := g.opsPool(c.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if s, found, err := walSlot(c.Context(), pool, t, slot); err != nil {
				return err
			} else if found {
				cfg.Tables, cfg.Source = t, ops.WAL(s.Name)
				return runWALWatchdog(c.Context(), g, pool, t, cfg, asJSON)
			}
			cfg.Tables = t
			return runPollWatchdog(c.Context(), g, pool, cfg, asJSON)
		},
	}
	f := cmd.Flags()
	g.addDBFlags(f)
	durationVar(f, &cfg.StuckAfter, "stuck-after", ops.DefaultStuckAfter, "rows pending longer than this are stuck")
	durationVar(f, &cfg.MaxLag, "max-lag", ops.DefaultMaxLag, "lag SLO: the oldest pending row must be younger than this")
	f.IntVar(&cfg.Limit, "limit", ops.DefaultStuckLimit, "list at most this many stuck rows (all are counted)")
	f.BoolVar(&asJSON, "json", false, "print JSON for scripts")
	f.StringVar(&slot, "slot", "", "the replication slot of an outbox relayed with --mode wal (default outbox_<database>_<table>_<hash>; when it exists, the slot is checked instead of pending rows)")
	f.Int64Var(&cfg.MaxSlotLagBytes, "max-slot-lag-bytes", ops.DefaultMaxSlotLagBytes, "WAL mode: unhealthy when the slot is further behind than this many bytes")
	durationVar(f, &cfg.MaxInactive, "max-slot-inactive", ops.DefaultStuckAfter, "WAL mode: unhealthy when the slot has had no reader for longer (PG 17+)")
	return cmd
}

// runPollWatchdog is the watchdog of an outbox relayed by polling: its
// stuck rows and its lag.
func runPollWatchdog(ctx context.Context, g *globals, db outbox.DB, cfg ops.WatchdogConfig, asJSON bool) error {
	t := cfg.Tables
	rep, err := ops.Check(ctx, db, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		if err := writeJSON(g, reportJSON(t, rep)); err != nil {
			return err
		}
	} else if err := printReport(g, t, rep); err != nil {
		return err
	}
	if rep.Healthy() {
		return nil
	}
	var why []string
	if rep.Lag.Stuck > 0 {
		why = append(why, fmt.Sprintf("%d row(s) stuck (%d held; the rest wait behind them or were pending longer than %s)", rep.Lag.Stuck, rep.Held, rep.StuckAfter))
	}
	if rep.LagBreached {
		why = append(why, fmt.Sprintf("lag %s is over the %s SLO", fmtAge(rep.OldestPendingAge), rep.MaxLag))
	}
	why = append(why, rep.Partitions.Problems()...)
	return &exitError{code: 1, msg: "unhealthy: " + strings.Join(why, "; ")}
}

// printPartitionProblems lists a partitioned outbox's watchdog findings.
func printPartitionProblems(g *globals, rep ops.Report) {
	if rep.Partitions == nil {
		return
	}
	fmt.Fprintf(g.stdout, "partitions: %s\n", fmtHeadroom(rep.Partitions.Headroom))
	for _, p := range rep.Partitions.Problems() {
		fmt.Fprintf(g.stdout, "  - %s\n", oneLine(p))
	}
}

// runWALWatchdog is the watchdog of an outbox relayed from the WAL.
func runWALWatchdog(ctx context.Context, g *globals, db outbox.DB, t outbox.Tables, cfg ops.WatchdogConfig, asJSON bool) error {
	if cfg.MaxSlotLagBytes <= 0 || cfg.MaxInactive <= 0 {
		return fmt.Errorf("--max-slot-lag-bytes (%d) and --max-slot-inactive (%s) must be positive, e.g. 1073741824 and 5m", cfg.MaxSlotLagBytes, cfg.MaxInactive)
	}
	rep, err := ops.Check(ctx, db, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		if err := writeJSON(g, walReportJSON(t, rep)); err != nil {
			return err
		}
	} else {
		s := rep.Slot
		fmt.Fprintf(g.stdout, "outbox %s (relayed from the WAL): slot %s %s behind (max %s), wal_status %s, reader %s\n",
			t.OutboxIdent(), s.Name, fmtBytes(s.LagBytes), fmtBytes(rep.MaxSlotLagBytes), s.WALStatus, fmtReader(s))
		for _, p := range rep.Problems {
			fmt.Fprintf(g.stdout, "  - %s\n", oneLine(p))
		}
		printPartitionProblems(g, rep)
	}
	if rep.Healthy() {
		return nil
	}
	return &exitError{code: 1, msg: "unhealthy: " + strings.Join(append(rep.Problems, rep.Partitions.Problems()...), "; ")}
}

func printReport(g *globals, t outbox.Tables, rep ops.Report) error {
	slo := "ok"
	if rep.LagBreached {
		slo = "BREACHED"
	}
	fmt.Fprintf(g.stdout, "outbox %s: %d pending, oldest %s (lag SLO %s: %s), %d stuck (pending > %s, or held, or behind a held row), %d held %s\n",
		t.OutboxIdent(), rep.Pending, fmtAge(rep.OldestPendingAge), rep.MaxLag, slo, rep.Lag.Stuck, rep.StuckAfter, rep.Held, fmtHeld(rep.Lag))
	printPartitionProblems(g, rep)
	if len(rep.Stuck) == 0 {
		return nil
	}
	fmt.Fprintln(g.stdout)
	w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tAGGREGATE\tTYPE\tAGE\tWAITS FOR\tREASON\tATTEMPTS\tRETRY\tLAST ERROR")
	for _, s := range rep.Stuck {
		waits, reason, attempts, retry, lastErr := "-", "-", "-", "-", "-"
		if s.BlockedBy != 0 {
			waits = fmt.Sprint(s.BlockedBy)
		}
		if s.LastError != "" {
			reason, attempts, lastErr = oneLine(s.Reason), fmt.Sprint(s.Attempts), oneLine(s.LastError)
			switch {
			case s.HeldUntil.IsZero():
				retry = "lifted"
			case s.HeldUntil.After(time.Now()):
				retry = "in " + fmtAge(time.Until(s.HeldUntil))
			default:
				retry = "due"
			}
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.AggregateID, clip.Field(clip.Text(s.Type, 60)), fmtAge(s.Age), waits, reason, attempts, retry, clip.Text(lastErr, 300))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if more := rep.Lag.Stuck - int64(len(rep.Stuck)); more > 0 {
		fmt.Fprintf(g.stdout, "... and %d more (raise --limit to list them)\n", more)
	}
	return nil
}

func reportJSON(t outbox.Tables, rep ops.Report) map[string]any {
	rows := make([]map[string]any, 0, len(rep.Stuck))
	for _, s := range rep.Stuck {
		row := map[string]any{
			"id":           s.ID,
			"aggregate_id": s.AggregateID,
			"type":         s.Type,
			"created_at":   timeOrNil(s.CreatedAt),
			"age_seconds":  s.Age.Seconds(),
			"blocked_by":   nil,
			"reason":       nil,
			"last_error":   nil,
			"held_until":   timeOrNil(s.HeldUntil),
			"attempts":     s.Attempts,
			"failed_at":    timeOrNil(s.FailedAt),
		}
		if s.BlockedBy != 0 {
			row["blocked_by"] = s.BlockedBy
		}
		if s.LastError != "" {
			row["reason"] = s.Reason
			row["last_error"] = s.LastError
		}
		rows = append(rows, row)
	}
	return map[string]any{
		"outbox":                     t.OutboxIdent(),
		"healthy":                    rep.Healthy(),
		"pending":                    rep.Pending,
		"oldest_pending_age_seconds": rep.OldestPendingAge.Seconds(),
		"max_lag_seconds":            rep.MaxLag.Seconds(),
		"lag_breached":               rep.LagBreached,
		"stuck":                      rep.Lag.Stuck,
		"stuck_after_seconds":        rep.StuckAfter.Seconds(),
		"held":                       rep.Held,
		"held_by_reason":             rep.HeldByReason,
		"stuck_rows":                 rows,
		"partitions":                 partitionStatusJSON(rep.Partitions),
	}
}
