package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/ops/switchover"
)

func newSwitchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "switch",
		Short: "Move an outbox between the polling relay and the WAL source, losing and reordering nothing",
		Long: `switch does the database's part of moving an outbox from one relay source
to the other, while producers keep writing, and waits where that waits:

  to-wal    from 'outbox relay' (polling) to 'outbox relay --mode wal'
  to-poll   from 'outbox relay --mode wal' back to 'outbox relay'

Each prints the steps that are left: stopping the relayers of the old
source with SIGTERM and starting those of the new one. It stops and starts
nothing itself. Both directions publish some events twice (at-least-once:
consumers deduplicate on event_id), none out of its aggregate's order.
docs/wal.md ("Switching between the polling relay and the WAL source") says
why each cut is exact.`,
	}
	groupOnly(cmd)
	g.addDBFlags(cmd.PersistentFlags())
	cmd.AddCommand(newSwitchToWALCmd(g), newSwitchToPollCmd(g))
	return cmd
}

// switchFlags are the flags both directions share.
type switchFlags struct {
	slot, publication string
	timeout           time.Duration
	asJSON            bool
}

func (s *switchFlags) register(c *cobra.Command, timeout time.Duration, timeoutUsage, publicationUsage string) {
	f := c.Flags()
	f.StringVar(&s.slot, "slot", "", "the WAL source's replication slot (default: the WAL relay's, outbox_<database>_<table>_<hash>), as given to outbox relay --mode wal")
	f.StringVar(&s.publication, "publication", "", publicationUsage)
	durationVar(f, &s.timeout, "timeout", timeout, timeoutUsage)
	f.BoolVar(&s.asJSON, "json", false, "print JSON for scripts (the next steps included)")
}

func (s *switchFlags) check() error {
	if s.timeout <= 0 {
		return fmt.Errorf("--timeout %s: use a positive duration, e.g. 5m", formatDays(s.timeout))
	}
	return nil
}

func newSwitchToWALCmd(g *globals) *cobra.Command {
	var sf switchFlags
	cmd := &cobra.Command{
		Use:   "to-wal",
		Short: "Prepare the move from the polling relay to the WAL source, while the polling relayers run",
		Long: `to-wal runs while the polling relayers (outbox relay) still run. It

  1. creates the publication and the replication slot, as
     'outbox relay --mode wal --setup-only' does: every event committed
     from then on is in the slot;
  2. reads the cut, the highest id committed once the slot exists: an
     event the slot lacks was committed before it, so its id is at most
     the cut;
  3. waits, up to --timeout, until the polling relayers have dispatched
     every row up to the cut, logging progress on stderr. A held row (a
     relayer recorded a permanent failure) is never dispatched by itself:
     it is named with what to do ('outbox events retry ID --yes', or
     'park'; 'outbox watchdog' lists them).

Then everything older than the slot is in Kafka, and it prints what is
left: stop the polling relayers with SIGTERM, then start
'outbox relay --mode wal', in that order. It is idempotent: after a
timeout, run it again. It refuses when a process reads the slot already
(the WAL source runs). Until a WAL relayer reads it, the slot keeps WAL on
the server's disk.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := sf.check(); err != nil {
				return err
			}
			log, pool, t, err := g.verbSession(c.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			seen := map[int64]bool{}
			res, err := switchover.PrepareSwitchToWAL(c.Context(), pool, switchover.SwitchToWALConfig{
				Tables: t, Slot: sf.slot, Publication: sf.publication, Timeout: sf.timeout,
				Progress: func(p switchover.DrainProgress) { logDrain(log, p, seen) },
			})
			if err != nil {
				return switchErr(err, sf.timeout)
			}
			steps := []string{
				"stop every polling relayer (outbox relay) with SIGTERM; the batch in flight finishes within its --shutdown-timeout",
				"start the WAL source: " + relayCommand(t, "--mode wal", sf.slot, sf.publication) + " (as many replicas as you like); it streams the slot from " + res.Setup.SlotLSN,
			}
			if sf.asJSON {
				return writeJSON(g, map[string]any{
					"outbox":              t.OutboxIdent(),
					"direction":           "to-wal",
					"slot":                res.Setup.Slot,
					"slot_created":        res.Setup.SlotCreated,
					"slot_lsn":            res.Setup.SlotLSN,
					"publication":         res.Setup.Publication,
					"publication_created": res.Setup.PublicationCreated,
					"cut_id":              res.Cut,
					"pending_at_cut":      res.PendingAtCut,
					"waited_seconds":      res.Waited.Seconds(),
					"next_steps":          steps,
				})
			}
			printWALSetup(g, t, res.Setup)
			fmt.Fprintf(g.stdout, "cut: id %d (an event the slot lacks was committed before it existed, so its id is at most this)\n", res.Cut)
			if res.PendingAtCut == 0 {
				fmt.Fprintln(g.stdout, "no row up to the cut was pending: everything the slot lacks is in Kafka")
			} else {
				fmt.Fprintf(g.stdout, "the polling relayers dispatched the %d row(s) pending up to the cut in %s: everything the slot lacks is in Kafka\n", res.PendingAtCut, fmtAge(res.Waited))
			}
			printSteps(g, steps, "Until then the slot keeps WAL on the server's disk for a reader that is not there yet. Do not run a polling relayer on this outbox again except through 'outbox switch to-poll': it would publish every row still in the table.")
			return nil
		},
	}
	sf.register(cmd, switchover.DefaultSwitchToWALTimeout, "how long to wait for the polling relayers to dispatch the rows up to the cut",
		"the publication of the outbox's inserts (default: the slot's default name), as given to outbox relay --mode wal")
	return cmd
}

// logDrain logs to-wal's progress, and each held row once.
func logDrain(log *slog.Logger, p switchover.DrainProgress, seen map[int64]bool) {
	log.Info("waiting for the polling relayers to dispatch the rows up to the cut", "cut", p.Cut, "pending", p.Pending,
		"held_or_behind_held", p.Blocked, "elapsed", p.Elapsed.Round(time.Millisecond))
	for _, h := range p.Held {
		if seen[h.ID] {
			continue
		}
		seen[h.ID] = true
		log.Warn("a held row blocks the switch: fix the cause and run 'outbox events retry ID --yes', or 'outbox events park ID --reason TEXT --yes' to let the rest of its aggregate go",
			"id", h.ID, "aggregate_id", h.AggregateID, "type", clip.Text(h.Type, 60), "reason", h.Reason, "attempts", h.Attempts, "last_error", clip.Text(oneLine(h.LastError), 300))
	}
}

func newSwitchToPollCmd(g *globals) *cobra.Command {
	var sf switchFlags
	cmd := &cobra.Command{
		Use:   "to-poll",
		Short: "Mark what the WAL source published, while it runs, to move back to the polling relay",
		Long: `to-poll runs while a WAL relayer (outbox relay --mode wal) streams the slot.
In one REPEATABLE READ transaction it

  1. reads the cut, pg_current_wal_insert_lsn(), as its first statement,
     which takes the snapshot: every row the snapshot sees committed
     before the cut;
  2. waits until the slot's confirmed position passes the cut: the broker
     then has all of those rows;
  3. marks them dispatched (UPDATE ... SET dispatched_at = now() WHERE
     dispatched_at IS NULL sees only the snapshot's rows), and commits.

Rows committed after the cut stay pending, for the polling relay. The
transaction is kept short: it opens once the relayer has caught up with
the WAL, and the command writes a heartbeat so the relayer confirms past
the cut at once. It refuses when the slot does not exist or no WAL
relayer reads it (it would wait forever), and gives up after --timeout;
either way nothing is marked. Then it prints what is left: stop the WAL
relayers with SIGTERM, drop the slot and the publication
('outbox relay --mode wal --teardown'), start 'outbox relay'.

Producers must write plain inserts by then (Emit, <outbox>_emit or
INSERT): events written as insert+delete or as logical messages have no
row for a poller to read.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return runSwitchToPoll(c.Context(), g, &sf) },
	}
	sf.register(cmd, switchover.DefaultSwitchToPollTimeout, "how long to wait, in all, for the WAL relayer to confirm the cut",
		"the WAL source's publication, when not the default, for the teardown command printed")
	return cmd
}

// runSwitchToPoll marks what the WAL source published, once the slot has
// confirmed the cut, and prints the steps left.
func runSwitchToPoll(ctx context.Context, g *globals, sf *switchFlags) error {
	if err := sf.check(); err != nil {
		return err
	}
	log, pool, t, err := g.verbSession(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	slot, err := ops.SlotName(ctx, pool, t, sf.slot)
	if err != nil {
		return err
	}
	res, err := switchover.PrepareSwitchToPoll(ctx, pool, switchover.SwitchToPollConfig{
		Tables: t, Slot: sf.slot, Timeout: sf.timeout,
		Progress: func(p switchover.ConfirmProgress) {
			msg := "waiting for the WAL relayer to catch up before the marking transaction"
			if p.InTransaction {
				msg = "waiting for the slot to confirm the cut"
			}
			log.Info(msg, "slot", slot, "target", p.Target, "confirmed", p.Confirmed, "reader_pid", p.ReaderPID, "elapsed", p.Elapsed.Round(time.Millisecond))
		},
	})
	if err != nil {
		return switchErr(err, sf.timeout)
	}
	return reportSwitchToPoll(g, t, res, sf)
}

// reportSwitchToPoll prints what to-poll marked and the steps left, as
// text or JSON.
func reportSwitchToPoll(g *globals, t outbox.Tables, res switchover.SwitchToPollResult, sf *switchFlags) error {
	steps := []string{
		"stop every WAL relayer (outbox relay --mode wal) with SIGTERM",
		"drop the slot and the publication: " + relayCommand(t, "--mode wal --teardown", sf.slot, sf.publication),
		"start the polling relay: " + relayCommand(t, "", "", "") + "; it publishes the rows committed after the cut, in order for each aggregate",
	}
	if sf.asJSON {
		return writeJSON(g, map[string]any{
			"outbox":               t.OutboxIdent(),
			"direction":            "to-poll",
			"slot":                 res.Slot,
			"cut_lsn":              res.Cut,
			"marked":               res.Marked,
			"reader_pid":           res.ReaderPID,
			"catch_up_seconds":     res.CatchUp.Seconds(),
			"transaction_seconds":  res.Transaction.Seconds(),
			"transaction_attempts": res.Attempts,
			"next_steps":           steps,
		})
	}
	fmt.Fprintf(g.stdout, "outbox %s: marked %d row(s) dispatched: every row committed before WAL position %s (the cut), which slot %s confirmed, so the broker has them\n",
		t.OutboxIdent(), res.Marked, res.Cut, res.Slot)
	fmt.Fprintf(g.stdout, "the WAL relayer (walsender pid %d) caught up in %s; the marking transaction took %s", res.ReaderPID, fmtAge(res.CatchUp), fmtAge(res.Transaction))
	if res.Attempts > 1 {
		fmt.Fprintf(g.stdout, " (%d attempts: rows changed under the first)", res.Attempts)
	}
	fmt.Fprintln(g.stdout)
	printSteps(g, steps, "Rows committed after the cut stay pending: the polling relay publishes them, and again those the WAL relayer sent before it stopped (consumers deduplicate on event_id). Start it only after step 1, or both publish the same rows.")
	return nil
}

// switchErr adds the flag to raise to a timeout.
func switchErr(err error, timeout time.Duration) error {
	if errors.Is(err, switchover.ErrSwitchTimeout) {
		return fmt.Errorf("%w (--timeout %s)", err, formatDays(timeout))
	}
	return err
}

// printWALSetup says what SetupWAL created or found.
func printWALSetup(g *globals, t outbox.Tables, s switchover.WALSetup) {
	if s.PublicationCreated {
		fmt.Fprintf(g.stdout, "publication %s: created (FOR TABLE %s, inserts only)\n", s.Publication, t.OutboxIdent())
	} else {
		fmt.Fprintf(g.stdout, "publication %s: exists already\n", s.Publication)
	}
	state := "exists already, at"
	if s.SlotCreated {
		state = "created at"
	}
	fmt.Fprintf(g.stdout, "replication slot %s: %s %s; every event committed after that position is in it\n", s.Slot, state, s.SlotLSN)
	if s.ReaderPID != 0 {
		fmt.Fprintf(g.stdout, "the slot is read by pid %d (%s)\n", s.ReaderPID, s.ReaderName)
	}
}

// printSteps prints the steps the operator has left, and a note.
func printSteps(g *globals, steps []string, note string) {
	fmt.Fprintln(g.stdout)
	fmt.Fprintln(g.stdout, "Next steps (this command stops and starts nothing):")
	for i, s := range steps {
		fmt.Fprintf(g.stdout, "  %d. %s\n", i+1, s)
	}
	fmt.Fprintln(g.stdout, note)
}

// relayCommand is the `outbox relay` command line for this outbox: the
// table flags and slot names given here, never the database URL (it may
// carry a password).
func relayCommand(t outbox.Tables, mode, slot, publication string) string {
	parts := []string{"outbox relay"}
	if mode != "" {
		parts = append(parts, mode)
	}
	if t.Schema != outbox.DefaultSchema {
		parts = append(parts, "--schema "+quoteArg(t.Schema))
	}
	if t.Outbox != outbox.DefaultOutboxTable {
		parts = append(parts, "--table "+quoteArg(t.Outbox))
	}
	if slot != "" {
		parts = append(parts, "--slot "+quoteArg(slot))
	}
	if publication != "" {
		parts = append(parts, "--publication "+quoteArg(publication))
	}
	return strings.Join(parts, " ")
}
