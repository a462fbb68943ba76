package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox/ops"
)

// cleanupOptions are the flags of `outbox cleanup`.
type cleanupOptions struct {
	cfg        ops.CleanupConfig
	slot       string
	allowShort bool
}

func newCleanupCmd(g *globals) *cobra.Command {
	o := &cleanupOptions{}
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
table is then where its missing events are republished from.

A partitioned outbox ('outbox migrate up --partitioned') deletes no row:
cleanup first makes the partitions it needs ahead of its id sequence, then
detaches (DETACH PARTITION ... CONCURRENTLY) and drops each partition whose
newest row is older than --retention and that holds no pending row and no
parked row's id (from the WAL: once the slot confirmed a position after its
last transaction). It checks the partition again after the detach and
attaches it back when a row became pending meanwhile. A partition kept past
the retention is printed with why; 'outbox partitions list' shows them all.
A cleanup killed mid-way is finished by the next one.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return runCleanup(c, g, o) },
	}
	f := cmd.Flags()
	g.addDBFlags(f)
	durationVar(f, &o.cfg.Retention, "retention", ops.DefaultRetention, "delete dispatched rows older than this")
	durationVar(f, &o.cfg.ProcessedRetention, "processed-retention", ops.DefaultProcessedRetention, "delete processed_events rows older than this; longer than any redelivery window; 0 skips the table")
	f.IntVar(&o.cfg.BatchSize, "batch-size", ops.DefaultCleanupBatch, "rows per delete statement (each its own transaction)")
	deprecatedAlias(f, "batch-size", "batch")
	durationVar(f, &o.cfg.Pause, "pause", ops.DefaultCleanupPause, "pause between batches")
	f.StringVar(&o.slot, "slot", "", "the replication slot of an outbox relayed with --mode wal (default outbox_<database>_<table>_<hash>; when it exists, rows the slot confirmed are deleted whatever their dispatched_at)")
	durationVar(f, &o.cfg.WALConfirmWait, "confirm-wait", ops.DefaultWALConfirmWait, "WAL mode: how long to wait for the slot to confirm the position noted at the start")
	f.BoolVar(&o.allowShort, allowShortRetentionFlag, false, "allow a --retention or --processed-retention under "+formatDays(minRetention))
	return cmd
}

// check refuses the flags of a cleanup that cannot run, or that would
// delete more than meant.
func (o *cleanupOptions) check(f *pflag.FlagSet) error {
	cfg := &o.cfg
	switch {
	case cfg.Retention <= 0:
		return fmt.Errorf("--retention %s: use a positive duration, e.g. 7d", formatDays(cfg.Retention))
	case cfg.ProcessedRetention < 0:
		return fmt.Errorf("--processed-retention %s: use a positive duration, e.g. 30d, or 0 to leave processed_events alone", formatDays(cfg.ProcessedRetention))
	case cfg.BatchSize < 1 || cfg.BatchSize > 1_000_000:
		return fmt.Errorf("%s %d: use 1 to 1000000 rows per statement", flagAsGiven(f, "batch-size", "batch"), cfg.BatchSize)
	case cfg.Pause < 0:
		return fmt.Errorf("--pause %s: use 0 or a positive duration", cfg.Pause)
	}
	return checkRetentions(cfg.Retention, cfg.ProcessedRetention, o.allowShort)
}

// runCleanup runs one cleanup of the outbox and its processed_events and
// prints what each deleted.
func runCleanup(c *cobra.Command, g *globals, o *cleanupOptions) (retErr error) {
	if err := o.check(c.Flags()); err != nil {
		return err
	}
	cfg := &o.cfg
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
	ws, wal, err := walSlot(c.Context(), pool, t, o.slot)
	if err != nil {
		return err
	}
	if wal {
		cfg.Source = ops.WAL(ws.Name)
	}
	res, err := ops.Cleanup(c.Context(), pool, *cfg)
	if errors.Is(err, ops.ErrCleanupRunning) {
		return &exitError{code: 1, msg: "another cleanup of " + t.OutboxIdent() + " is running (a relay replica's hourly job, or another 'outbox cleanup'); nothing was deleted, try again later"}
	}
	printOutboxCleanup(g, *cfg, res, wal, ws.Name)
	var walErr error
	if errors.Is(err, ops.ErrSlotBehind) || errors.Is(err, ops.ErrPartitionsAhead) {
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
	printProcessedCleanup(g, *cfg, res)
	return nil
}

// printOutboxCleanup prints what the cleanup deleted from the outbox
// table, unless it failed before deleting anything.
func printOutboxCleanup(g *globals, cfg ops.CleanupConfig, res ops.CleanupResult, wal bool, slot string) {
	t := cfg.Tables
	if res.Partitions != nil {
		printPartitionCleanup(g.stdout, t.OutboxIdent(), cfg, res.Partitions)
		return
	}
	if wal && res.WALHorizon != "" {
		fmt.Fprintf(g.stdout, "%s: deleted %d rows older than %s (created before %s) and committed before %s, which slot %s has confirmed, in %d %s, %s\n",
			t.OutboxIdent(), res.Outbox.Deleted, formatDays(cfg.Retention), res.OutboxCutoff.UTC().Format(time.RFC3339), res.WALHorizon, slot,
			res.Outbox.Batches, plural(res.Outbox.Batches, "batch", "batches"), res.Outbox.Duration.Round(time.Millisecond))
	} else if !wal && !res.OutboxCutoff.IsZero() { // else it failed before deleting anything
		fmt.Fprintf(g.stdout, "%s: deleted %d dispatched rows older than %s (dispatched before %s) in %d %s, %s\n",
			t.OutboxIdent(), res.Outbox.Deleted, formatDays(cfg.Retention), res.OutboxCutoff.UTC().Format(time.RFC3339),
			res.Outbox.Batches, plural(res.Outbox.Batches, "batch", "batches"), res.Outbox.Duration.Round(time.Millisecond))
	}
}

// printProcessedCleanup prints what the cleanup deleted from
// processed_events, or that it left the table alone.
func printProcessedCleanup(g *globals, cfg ops.CleanupConfig, res ops.CleanupResult) {
	t := cfg.Tables
	if cfg.SkipProcessed {
		fmt.Fprintf(g.stdout, "%s: left alone (--processed-retention 0)\n", t.ProcessedIdent())
		return
	}
	fmt.Fprintf(g.stdout, "%s: deleted %d rows older than %s (processed before %s) in %d %s, %s\n",
		t.ProcessedIdent(), res.Processed.Deleted, formatDays(cfg.ProcessedRetention), res.ProcessedCutoff.UTC().Format(time.RFC3339),
		res.Processed.Batches, plural(res.Processed.Batches, "batch", "batches"), res.Processed.Duration.Round(time.Millisecond))
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
