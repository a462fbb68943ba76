package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox/ops"
)

func newCleanupCmd(g *globals) *cobra.Command {
	var (
		cfg        ops.CleanupConfig
		slot       string
		allowShort bool
	)
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Delete dispatched outbox rows and processed_events rows past their retention, in small batches",
		Long: `cleanup deletes dispatched outbox rows older than --retention (by
dispatched_at) and consumer dedupe rows older than --processed-retention (by
processed_at). Pending rows are never deleted. It works in batches of at most
--batch-size rows, each its own short transaction, with --pause between them, so
it never holds long locks nor one long transaction; interrupting it keeps
what was deleted.

One cleanup runs per outbox at a time: 'outbox relay' runs the same job
hourly, and whichever starts second skips (this command then exits 1).

Keep --processed-retention longer than any window in which a consumer can see
a record again (the topic's retention if consumers may rewind or reset
offsets, replays): a record redelivered after its dedupe row is deleted is
applied twice. 0 leaves processed_events alone.

An outbox relayed from the WAL ('outbox relay --mode wal') never marks rows
dispatched. When its replication slot exists (outbox_<database>_<table>_<hash> by default, or
--slot), cleanup deletes rows older than --retention whatever their
dispatched_at, but only rows committed before a WAL position the slot has
confirmed (the broker has their events): it notes the position, waits up to
--confirm-wait for the slot to pass it, and otherwise deletes no outbox row
and exits 1. A lost, unreserved or missing slot also deletes nothing: the
table is then where its missing events are republished from.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) (retErr error) {
			switch {
			case cfg.Retention <= 0:
				return fmt.Errorf("--retention %s: use a positive duration, e.g. 7d", formatDays(cfg.Retention))
			case cfg.ProcessedRetention < 0:
				return fmt.Errorf("--processed-retention %s: use a positive duration, e.g. 30d, or 0 to leave processed_events alone", formatDays(cfg.ProcessedRetention))
			case cfg.BatchSize < 1 || cfg.BatchSize > 1_000_000:
				return fmt.Errorf("%s %d: use 1 to 1000000 rows per statement", flagAsGiven(c.Flags(), "batch-size", "batch"), cfg.BatchSize)
			case cfg.Pause < 0:
				return fmt.Errorf("--pause %s: use 0 or a positive duration", cfg.Pause)
			}
			if err := checkRetentions(cfg.Retention, cfg.ProcessedRetention, allowShort); err != nil {
				return err
			}
			cfg.SkipProcessed = cfg.ProcessedRetention == 0
			if cfg.Pause == 0 {
				cfg.Pause = time.Nanosecond // 0 is ops' "default"; here it means no pause
			}
			log, err := g.logger()
			if err != nil {
				return err
			}
			pool, t, err := g.opsPool(c.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			cfg.Tables, cfg.Logger = t, log
			ws, wal, err := walSlot(c.Context(), pool, t, slot)
			if err != nil {
				return err
			}
			if wal {
				cfg.Source = ops.WAL(ws.Name)
			}
			res, err := ops.Cleanup(c.Context(), pool, cfg)
			if errors.Is(err, ops.ErrCleanupRunning) {
				return &exitError{code: 1, msg: "another cleanup of " + t.OutboxIdent() + " is running (a relay replica's hourly job, or another 'outbox cleanup'); nothing was deleted, try again later"}
			}
			if wal && res.WALHorizon != "" {
				fmt.Fprintf(g.stdout, "%s: deleted %d rows older than %s (created before %s) and committed before %s, which slot %s has confirmed, in %d %s, %s\n",
					t.OutboxIdent(), res.Outbox.Deleted, formatDays(cfg.Retention), res.OutboxCutoff.UTC().Format(time.RFC3339), res.WALHorizon, ws.Name,
					res.Outbox.Batches, plural(res.Outbox.Batches, "batch", "batches"), res.Outbox.Duration.Round(time.Millisecond))
			} else if !wal && !res.OutboxCutoff.IsZero() { // else it failed before deleting anything
				fmt.Fprintf(g.stdout, "%s: deleted %d dispatched rows older than %s (dispatched before %s) in %d %s, %s\n",
					t.OutboxIdent(), res.Outbox.Deleted, formatDays(cfg.Retention), res.OutboxCutoff.UTC().Format(time.RFC3339),
					res.Outbox.Batches, plural(res.Outbox.Batches, "batch", "batches"), res.Outbox.Duration.Round(time.Millisecond))
			}
			var walErr error
			if errors.Is(err, ops.ErrSlotBehind) {
				walErr, err = err, nil // the rest ran; report it, then fail
			}
			if err != nil {
				return err
			}
			defer func() {
				if walErr != nil && retErr == nil {
					retErr = &exitError{code: 1, msg: t.OutboxIdent() + ": " + walErr.Error()}
				}
			}()
			if res.Failures > 0 {
				fmt.Fprintf(g.stdout, "pruned %d failure records of rows no longer pending\n", res.Failures)
			}
			if cfg.SkipProcessed {
				fmt.Fprintf(g.stdout, "%s: left alone (--processed-retention 0)\n", t.ProcessedIdent())
				return nil
			}
			fmt.Fprintf(g.stdout, "%s: deleted %d rows older than %s (processed before %s) in %d %s, %s\n",
				t.ProcessedIdent(), res.Processed.Deleted, formatDays(cfg.ProcessedRetention), res.ProcessedCutoff.UTC().Format(time.RFC3339),
				res.Processed.Batches, plural(res.Processed.Batches, "batch", "batches"), res.Processed.Duration.Round(time.Millisecond))
			return nil
		},
	}
	f := cmd.Flags()
	g.addDBFlags(f)
	durationVar(f, &cfg.Retention, "retention", ops.DefaultRetention, "delete dispatched rows older than this")
	durationVar(f, &cfg.ProcessedRetention, "processed-retention", ops.DefaultProcessedRetention, "delete processed_events rows older than this; longer than any redelivery window; 0 skips the table")
	f.IntVar(&cfg.BatchSize, "batch-size", ops.DefaultCleanupBatch, "rows per delete statement (each its own transaction)")
	deprecatedAlias(f, "batch-size", "batch")
	durationVar(f, &cfg.Pause, "pause", ops.DefaultCleanupPause, "pause between batches")
	f.StringVar(&slot, "slot", "", "the replication slot of an outbox relayed with --mode wal (default outbox_<database>_<table>_<hash>; when it exists, rows the slot confirmed are deleted whatever their dispatched_at)")
	durationVar(f, &cfg.WALConfirmWait, "confirm-wait", ops.DefaultWALConfirmWait, "WAL mode: how long to wait for the slot to confirm the position noted at the start")
	f.BoolVar(&allowShort, allowShortRetentionFlag, false, "allow a --retention or --processed-retention under "+formatDays(minRetention))
	return cmd
}

// minRetention is the shortest --retention and --processed-retention taken
// without --allow-short-retention: a retention of 1ns, a unit mistyped,
// deletes every dispatched row (or every consumer's dedupe row, so that
// each redelivered record is applied again) at once.
const minRetention = time.Minute

const allowShortRetentionFlag = "allow-short-retention"

// checkRetentions refuses a retention under minRetention unless allowed;
// 0, for the processed retention, leaves the table alone.
func checkRetentions(retention, processed time.Duration, allow bool) error {
	if allow {
		return nil
	}
	if retention > 0 && retention < minRetention {
		return fmt.Errorf("--retention %s is under %s: it deletes every dispatched row older than that at once; use e.g. 7d, or add --%s if you mean it",
			formatDays(retention), formatDays(minRetention), allowShortRetentionFlag)
	}
	if processed > 0 && processed < minRetention {
		return fmt.Errorf("--processed-retention %s is under %s: it deletes the consumers' dedupe rows at once, so a record delivered again is applied twice; "+
			"use e.g. 30d, 0 to leave processed_events alone, or add --%s if you mean it",
			formatDays(processed), formatDays(minRetention), allowShortRetentionFlag)
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
