package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/ops"
)

func newStatsCmd(g *globals) *cobra.Command {
	var (
		asJSON     bool
		stuckAfter time.Duration
		slot       string
	)
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show the backlog, lag, stuck rows, dispatch rate, size and bloat of the outbox table",
		Long: `stats reads one outbox table and prints what an operator looks at first:

  pending              rows committed and not yet dispatched
  oldest pending age   the dispatch lag; a healthy relay keeps it under a second
  stuck                rows pending longer than --stuck-after ('outbox watchdog' lists them)
  held                 pending rows whose last attempt failed for good, by reason
                       (they count as stuck at once; 'outbox events show ID')
  dispatched           rows dispatched in the last minute and hour, with the rate
  table size           the table with its indexes and TOAST
  live / dead rows     dead rows are what vacuum has yet to reclaim; a high share
                       means bloat (vacuum lags behind the relay and cleanup)

No query scans the whole table. --json prints the same for scripts.

An outbox relayed from the WAL ('outbox relay --mode wal') never marks rows
dispatched: when its replication slot exists (outbox_<database>_<table>_<hash> by default,
or --slot), stats shows the slot instead of pending rows: its lag in bytes
of WAL, wal_status (lost: events may be missing), whether a relay reads it,
and how much WAL may still be written before it is lost.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if stuckAfter <= 0 {
				return fmt.Errorf("--stuck-after %s: use a positive duration, e.g. 5m", stuckAfter)
			}
			pool, t, err := g.opsPool(c.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if ws, found, err := walSlot(c.Context(), pool, t, slot); err != nil {
				return err
			} else if found {
				st, err := ops.ReadStats(c.Context(), pool, ops.StatsConfig{Tables: t, Source: ops.WAL(ws.Name)})
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(g, walStatsJSON(t, st))
				}
				return printWALStats(g, t, st)
			}
			s, err := ops.ReadStats(c.Context(), pool, ops.StatsConfig{Tables: t, StuckAfter: stuckAfter})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g, statsJSON(t, s))
			}
			return printStats(g, t, s)
		},
	}
	g.addDBFlags(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for scripts")
	durationVar(cmd.Flags(), &stuckAfter, "stuck-after", ops.DefaultStuckAfter, "rows pending longer than this count as stuck")
	cmd.Flags().StringVar(&slot, "slot", "", "the replication slot of an outbox relayed with --mode wal (default outbox_<database>_<table>_<hash>; when it exists, the slot is shown instead of pending rows)")
	return cmd
}

// printStats prints the polling relay's figures of one outbox, in two
// columns.
func printStats(g *globals, t outbox.Tables, s ops.Stats) error {
	w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "outbox\t%s\n", t.OutboxIdent())
	fmt.Fprintf(w, "pending\t%d\n", s.Pending)
	fmt.Fprintf(w, "oldest pending age\t%s\t(the lag)\n", fmtAge(s.OldestPendingAge))
	fmt.Fprintf(w, "stuck (pending > %s, or held)\t%d\t(held rows and the rows behind them are stuck at once)\n", s.StuckAfter, s.Stuck)
	fmt.Fprintf(w, "held\t%d\t%s\n", s.Held, fmtHeld(s.Lag))
	fmt.Fprintf(w, "dispatched last minute\t%d\t(%.1f/s)\n", s.DispatchedLastMinute, float64(s.DispatchedLastMinute)/60)
	fmt.Fprintf(w, "dispatched last hour\t%d\t(%.1f/s)\n", s.DispatchedLastHour, float64(s.DispatchedLastHour)/3600)
	fmt.Fprintf(w, "table size\t%s\t(with indexes and TOAST)\n", fmtBytes(s.TableBytes))
	dead := 0.0
	if s.LiveRows+s.DeadRows > 0 {
		dead = 100 * float64(s.DeadRows) / float64(s.LiveRows+s.DeadRows)
	}
	fmt.Fprintf(w, "live / dead rows\t%d / %d\t(%.1f%% dead)\n", s.LiveRows, s.DeadRows, dead)
	fmt.Fprintf(w, "last vacuum\t%s\n", fmtVacuum(s.LastVacuum, s.LastAutovacuum))
	printPartitionStatus(w, s.Partitions)
	return w.Flush()
}

// statsJSON is the --json shape: snake_case keys, durations in seconds,
// times in RFC 3339 (null when never).
func statsJSON(t outbox.Tables, s ops.Stats) map[string]any {
	return map[string]any{
		"outbox":                     t.OutboxIdent(),
		"mode":                       "poll",
		"pending":                    s.Pending,
		"oldest_pending_age_seconds": s.OldestPendingAge.Seconds(),
		"stuck":                      s.Stuck,
		"stuck_after_seconds":        s.StuckAfter.Seconds(),
		"held":                       s.Held,
		"held_by_reason":             s.HeldByReason,
		"oldest_held_age_seconds":    s.OldestHeldAge.Seconds(),
		"dispatched_last_minute":     s.DispatchedLastMinute,
		"dispatched_last_hour":       s.DispatchedLastHour,
		"table_bytes":                s.TableBytes,
		"live_rows":                  s.LiveRows,
		"dead_rows":                  s.DeadRows,
		"last_vacuum":                timeOrNil(s.LastVacuum),
		"last_autovacuum":            timeOrNil(s.LastAutovacuum),
		"partitions":                 partitionStatusJSON(s.Partitions),
	}
}

// fmtHeld says why rows are held and for how long, e.g. "(too_large 2,
// undecodable 1; the oldest for 3m10s)".
func fmtHeld(l ops.Lag) string {
	if l.Held == 0 {
		return ""
	}
	reasons := make([]string, 0, len(l.HeldByReason))
	for r, n := range l.HeldByReason {
		reasons = append(reasons, fmt.Sprintf("%s %d", clip.Field(r), n))
	}
	slices.Sort(reasons)
	return fmt.Sprintf("(%s; the oldest for %s)", strings.Join(reasons, ", "), fmtAge(l.OldestHeldAge))
}

// opsPool connects for the operations commands (stats, watchdog, cleanup)
// and checks the schema is at this binary's version, so that a missing
// migration says "run outbox migrate up", not "relation does not exist".
func (g *globals) opsPool(ctx context.Context) (*pgxpool.Pool, outbox.Tables, error) {
	t, err := g.tables()
	if err != nil {
		return nil, t, err
	}
	pool, err := g.connect(ctx, 2)
	if err != nil {
		return nil, t, err
	}
	if err := checkSchema(ctx, pool, t); err != nil {
		pool.Close()
		return nil, t, err
	}
	return pool, t, nil
}

// checkSchema says, in one line with what to run, when the tables are
// missing or behind this binary's migrations, so that an unmigrated table
// gives one clear error rather than "relation does not exist".
func checkSchema(ctx context.Context, pool *pgxpool.Pool, t outbox.Tables) error {
	m, err := migrate.New(t)
	if err != nil {
		return err
	}
	return m.Validate(ctx, pool)
}

func writeJSON(g *globals, v any) error {
	enc := json.NewEncoder(g.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func timeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339)
}

// fmtAge rounds a duration to what a person reads: milliseconds below a
// second, tenths below a minute, seconds above.
func fmtAge(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func fmtVacuum(manual, auto time.Time) string {
	last, how := auto, "autovacuum"
	if manual.After(auto) {
		last, how = manual, "vacuum"
	}
	if last.IsZero() {
		return "never (since statistics were reset)"
	}
	return fmt.Sprintf("%s ago (%s)", fmtAge(time.Since(last)), how)
}
