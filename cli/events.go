package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay"
)

func newEventsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Look at one event and act on it: show, retry, park, unpark, replay",
		Long: `events are the operator's verbs on single outbox events (ids are the rows'
ids, the event_id header, as 'outbox watchdog' lists them):

  show ID                        the row, its failure and hold, what it waits behind
  retry ID | --aggregate UUID    lift the hold so every relayer retries now
  park ID --reason TEXT          take a pending row out of the outbox (breaks its
                                 aggregate's order on purpose)
  unpark ID                      put a parked row back, under its id
  replay --from-id A --to-id B   set dispatched rows back to pending to publish
                                 them again

Every verb that changes something is a dry run that prints what it would
change, unless given --yes; then it prints and logs what it changed, and
wakes the relayers (NOTIFY) so they act at once.`,
	}
	groupOnly(cmd)
	g.addDBFlags(cmd.PersistentFlags())
	cmd.AddCommand(newEventsShowCmd(g), newEventsRetryCmd(g), newEventsParkCmd(g), newEventsUnparkCmd(g), newEventsReplayCmd(g))
	return cmd
}

// dryRunNote ends every dry run.
func dryRunNote(g *globals, what string) {
	fmt.Fprintf(g.stdout, "dry run: nothing changed; add --yes to %s\n", what)
}

func parseEventID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("event id %q: use the row's id, a positive integer (the event_id header; 'outbox watchdog' lists stuck ones)", s)
	}
	return id, nil
}

func parseAggregate(flag, s string) (uuid.UUID, error) {
	if s == "" {
		return uuid.Nil, nil
	}
	id, err := uuid.Parse(s)
	if err != nil || id == uuid.Nil {
		return uuid.Nil, fmt.Errorf("%s %q: use the aggregate's UUID, e.g. 0190c1d2-7a3b-7c4d-8e5f-6a7b8c9d0e1f", flag, s)
	}
	return id, nil
}

func newEventsShowCmd(g *globals) *cobra.Command {
	var (
		asJSON bool
		full   bool
	)
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one event: its row, failure, hold, what it waits behind, or its parked row",
		Long: `show prints one event: id, aggregate, type, created_at, dispatched_at (or
pending), the size of its payload as published and of its Kafka record,
its headers and the first 500 bytes of its payload (--payload for all); the
last permanent failure a relayer recorded for it (reason, error, attempts,
first and last failure) with its hold (held_until, and whether it is active:
every relayer skips the aggregate until then); and, for a pending row, the
earlier pending row of its aggregate it waits behind. A parked event shows
its parked row with the reason and time it was parked.

It exits 1 when the id is in neither the outbox nor the parked table (never
written, or deleted by retention cleanup after it was dispatched). --json
prints the same for scripts.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			id, err := parseEventID(args[0])
			if err != nil {
				return err
			}
			ctx := c.Context()
			pool, t, err := g.opsPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			preview := ops.DefaultPreviewBytes
			if full {
				preview = -1
			}
			var d ops.EventDetail
			// One snapshot for the outbox and the parked table: an event
			// parked or unparked meanwhile is seen in one place.
			err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
				var err error
				d, err = ops.ShowEvent(ctx, tx, ops.ShowConfig{Tables: t, ID: id, PreviewBytes: preview})
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g, eventJSON(d))
			}
			return printEvent(g, d)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for scripts")
	cmd.Flags().BoolVar(&full, "payload", false, "print the whole payload, not its first 500 bytes")
	return cmd
}

func printEvent(g *globals, d ops.EventDetail) error {
	w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "event\t%d\n", d.ID)
	fmt.Fprintf(w, "state\t%s\n", d.State)
	fmt.Fprintf(w, "aggregate_id\t%s\n", d.AggregateID)
	fmt.Fprintf(w, "type\t%s\n", clip.Field(d.Type))
	fmt.Fprintf(w, "created_at\t%s\t(%s ago)\n", fmtTime(d.CreatedAt), fmtAge(time.Since(d.CreatedAt)))
	switch d.State {
	case ops.EventDispatched:
		fmt.Fprintf(w, "dispatched_at\t%s\n", fmtTime(d.DispatchedAt))
	case ops.EventPending:
		fmt.Fprintf(w, "dispatched_at\tpending\n")
	}
	if d.RecordBytes > 0 {
		fmt.Fprintf(w, "payload\t%d bytes\t(record: %d bytes on the wire when sent alone)\n", d.PayloadBytes, d.RecordBytes)
	} else {
		fmt.Fprintf(w, "payload\t%d bytes\n", d.PayloadBytes)
	}
	if d.ContentType != "" {
		fmt.Fprintf(w, "content type\t%s\t(a binary payload: shown in hex)\n", clip.PrintableJSON(d.ContentType))
	}
	headers := "-"
	if d.Headers != nil {
		headers = clip.PrintableJSON(string(d.Headers))
	}
	fmt.Fprintf(w, "headers\t%s\n", headers)
	if p := d.Parked; p != nil {
		fmt.Fprintf(w, "parked_at\t%s\t(%s ago)\n", fmtTime(p.ParkedAt), fmtAge(time.Since(p.ParkedAt)))
		fmt.Fprintf(w, "parked reason\t%s\n", oneLine(p.Reason))
		fmt.Fprintf(w, "last error\t%s\n", dash(oneLine(p.LastError)))
	}
	if f := d.Failure; f != nil {
		fmt.Fprintf(w, "failure\t%s: %s\n", oneLine(f.Reason), oneLine(f.Error))
		fmt.Fprintf(w, "attempts\t%d\t(first failed %s, last %s)\n", f.Attempts, fmtTime(f.FirstFailedAt), fmtTime(f.FailedAt))
		switch {
		case f.HeldUntil.IsZero():
			fmt.Fprintf(w, "held_until\t-\t(no hold: lifted, relayers retry it at their next claim)\n")
		case f.HoldActive:
			fmt.Fprintf(w, "held_until\t%s\t(active, %s left: every relayer skips aggregate %s until then; 'outbox events retry %d' lifts it)\n",
				fmtTime(f.HeldUntil), fmtAge(time.Until(f.HeldUntil)), d.AggregateID, d.ID)
		default:
			fmt.Fprintf(w, "held_until\t%s\t(not active)\n", fmtTime(f.HeldUntil))
		}
	} else if d.State == ops.EventPending {
		fmt.Fprintf(w, "failure\t-\t(none recorded)\n")
	}
	if d.BlockedBy != 0 {
		fmt.Fprintf(w, "waits behind\t%d\t(an earlier pending row of its aggregate: see 'outbox events show %d')\n", d.BlockedBy, d.BlockedBy)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if d.PayloadTruncated {
		shown := len(d.Payload)
		if d.ContentType != "" {
			shown = (len(d.Payload) - 2) / 2 // hex, after \x
		}
		fmt.Fprintf(g.stdout, "payload (first %d of %d bytes; --payload prints it all):\n%s...\n", shown, d.PayloadBytes, clip.PrintableJSON(d.Payload))
	} else {
		fmt.Fprintf(g.stdout, "payload:\n%s\n", clip.PrintableJSON(d.Payload))
	}
	return nil
}

// eventJSON is the --json shape: snake_case keys, times in RFC 3339 (null
// when none).
func eventJSON(d ops.EventDetail) map[string]any {
	m := map[string]any{
		"id":                d.ID,
		"state":             d.State,
		"aggregate_id":      d.AggregateID,
		"type":              d.Type,
		"created_at":        timeOrNil(d.CreatedAt),
		"dispatched_at":     timeOrNil(d.DispatchedAt),
		"payload_bytes":     d.PayloadBytes,
		"record_bytes":      d.RecordBytes,
		"payload":           d.Payload,
		"payload_truncated": d.PayloadTruncated,
		"content_type":      nil,
		"headers":           nil,
		"failure":           nil,
		"blocked_by":        nil,
		"parked":            nil,
	}
	if d.ContentType != "" {
		m["content_type"] = d.ContentType
	}
	if d.Headers != nil {
		m["headers"] = d.Headers
	}
	if f := d.Failure; f != nil {
		m["failure"] = map[string]any{
			"reason":          f.Reason,
			"error":           f.Error,
			"attempts":        f.Attempts,
			"first_failed_at": timeOrNil(f.FirstFailedAt),
			"failed_at":       timeOrNil(f.FailedAt),
			"held_until":      timeOrNil(f.HeldUntil),
			"hold_active":     f.HoldActive,
		}
	}
	if d.BlockedBy != 0 {
		m["blocked_by"] = d.BlockedBy
	}
	if p := d.Parked; p != nil {
		var lastErr any
		if p.LastError != "" {
			lastErr = p.LastError
		}
		m["parked"] = map[string]any{"parked_at": timeOrNil(p.ParkedAt), "reason": p.Reason, "last_error": lastErr}
	}
	return m
}

func newEventsRetryCmd(g *globals) *cobra.Command {
	var (
		aggregate string
		yes       bool
	)
	cmd := &cobra.Command{
		Use:   "retry (ID | --aggregate UUID)",
		Short: "Lift the hold on an event (or on every held event of an aggregate): every relayer retries it now",
		Long: `retry lifts holds. A relayer that sees an event fail for good (the broker
refuses it, or it cannot be decoded) holds its aggregate out of every
relayer's claims until held_until, retrying later with a growing backoff.
retry sets held_until to NULL on the event's failure record (or on every
active hold of --aggregate) and wakes the relayers, so each retries at its
next claim; the record's reason, error and attempts stay. Retry after fixing
the cause: a raised max.message.bytes, a topic created, an ACL granted.

A pending event that is not held is nothing to do (exit 0); it may wait
behind an earlier held row of its aggregate, which is named. A dispatched
event has no hold: to publish it again use 'outbox events replay'. Without
--yes, retry prints the holds it would lift and changes nothing.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return runEventsRetry(c.Context(), g, args, aggregate, yes)
		},
	}
	cmd.Flags().StringVar(&aggregate, "aggregate", "", "lift every active hold of this aggregate's pending events")
	cmd.Flags().BoolVar(&yes, "yes", false, "lift the holds (without it: a dry run)")
	return cmd
}

// runEventsRetry lifts the hold on the event args names (or on every held
// event of aggregate); without yes, it says what it would lift.
func runEventsRetry(ctx context.Context, g *globals, args []string, aggregate string, yes bool) error {
	cfg := ops.RetryConfig{Apply: yes}
	var err error
	switch {
	case len(args) == 1 && aggregate != "":
		return fmt.Errorf("retry takes an event id or --aggregate, not both")
	case len(args) == 1:
		if cfg.EventID, err = parseEventID(args[0]); err != nil {
			return err
		}
	case aggregate != "":
		if cfg.AggregateID, err = parseAggregate("--aggregate", aggregate); err != nil {
			return err
		}
	default:
		return fmt.Errorf("retry needs an event id or --aggregate UUID (see 'outbox events retry --help')")
	}
	log, pool, t, err := g.verbSession(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Tables, cfg.Logger = t, log
	res, err := ops.Retry(ctx, pool, cfg)
	if errors.Is(err, ops.ErrEventDispatched) {
		return fmt.Errorf("%w: outbox events replay --from-id %d --to-id %d --yes", err, cfg.EventID, cfg.EventID)
	}
	if err != nil {
		return err
	}
	if len(res.Holds) == 0 {
		if cfg.EventID != 0 {
			fmt.Fprintf(g.stdout, "event %d is pending and not held: relayers take it at their next claim; nothing to do\n", cfg.EventID)
			switch h := res.BlockedByHold; {
			case h != nil:
				fmt.Fprintf(g.stdout, "it waits behind event %d of its aggregate, which is held until %s (%s: %s); to retry that one: outbox events retry %d\n",
					h.EventID, fmtTime(h.Until), oneLine(h.Reason), oneLine(h.Err), h.EventID)
			case res.BlockedBy != 0:
				fmt.Fprintf(g.stdout, "it waits behind event %d of its aggregate (not held; see 'outbox events show %d')\n", res.BlockedBy, res.BlockedBy)
			}
		} else {
			fmt.Fprintf(g.stdout, "aggregate %s has no active hold on a pending event: nothing to do\n", cfg.AggregateID)
		}
		return nil
	}
	if res.Applied {
		fmt.Fprintf(g.stdout, "lifted %d hold(s) and woke the relayers; each retries at its next claim:\n", len(res.Holds))
	} else {
		fmt.Fprintf(g.stdout, "would lift %d hold(s); every running relayer would retry at its next claim:\n", len(res.Holds))
	}
	if err := printHolds(g, res.Holds); err != nil {
		return err
	}
	if !res.Applied {
		dryRunNote(g, "lift them")
	}
	return nil
}

func printHolds(g *globals, hs []relay.Hold) error {
	w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  ID\tAGGREGATE\tTYPE\tHELD UNTIL\tATTEMPTS\tREASON\tERROR")
	for _, h := range hs {
		fmt.Fprintf(w, "  %d\t%s\t%s\t%s\t%d\t%s\t%s\n", h.EventID, h.AggregateID, clip.Field(clip.Text(h.Type, 60)), fmtTime(h.Until), h.Attempts, oneLine(h.Reason), clip.Text(oneLine(h.Err), 300))
	}
	return w.Flush()
}

func newEventsParkCmd(g *globals) *cobra.Command {
	var (
		reason      string
		lockTimeout time.Duration
		yes         bool
	)
	cmd := &cobra.Command{
		Use:   "park ID --reason TEXT",
		Short: "Take a pending event out of the outbox, with a reason, so the rest of its aggregate flows",
		Long: `park moves a pending event out of the outbox into the parked table
(<outbox>_parked), whole, with --reason and the last error a relayer
recorded, and deletes its failure record, in one transaction; then wakes
the relayers.

Parking breaks the aggregate's order on purpose: the aggregate's later
events, held back behind this one, are published without it, and if it is
unparked it goes out after them. Park an event the consumers can do without
(or will get another way), and tell their owners.

It first locks the row, waiting at most --lock-timeout: a relayer may be
publishing it right now; then it says so, and you try again. A dispatched
event cannot be parked. Without --yes, park prints what it would do and
changes nothing. 'outbox events unpark ID' puts it back.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return runEventsPark(c.Context(), g, args[0], reason, lockTimeout, yes)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why it is parked (required), kept with the parked row")
	durationVar(cmd.Flags(), &lockTimeout, "lock-timeout", ops.DefaultParkLockTimeout, "how long to wait for the row's lock (a relayer may be publishing it)")
	cmd.Flags().BoolVar(&yes, "yes", false, "park it (without it: a dry run)")
	return cmd
}

// runEventsPark parks the event arg names; without yes, it says what it
// would do.
func runEventsPark(ctx context.Context, g *globals, arg, reason string, lockTimeout time.Duration, yes bool) error {
	id, err := parseEventID(arg)
	if err != nil {
		return err
	}
	if strings.TrimSpace(reason) == "" {
		return fmt.Errorf("park needs --reason \"...\": say why, for whoever unparks it")
	}
	if lockTimeout <= 0 {
		return fmt.Errorf("--lock-timeout %s: use a positive duration, e.g. 5s", lockTimeout)
	}
	log, pool, t, err := g.verbSession(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := ops.Park(ctx, pool, ops.ParkConfig{Tables: t, ID: id, Reason: reason, LockTimeout: lockTimeout, Apply: yes, Logger: log})
	if err != nil {
		return err
	}
	ev := res.Event
	verb := "would park"
	if res.Applied {
		verb = "parked"
	}
	fmt.Fprintf(g.stdout, "%s event %d (aggregate %s, %s, created %s) with reason %q\n", verb, ev.ID, ev.AggregateID, clip.Field(ev.Type), fmtTime(ev.CreatedAt), ev.Reason)
	fmt.Fprintf(g.stdout, "  last error: %s\n", dash(oneLine(ev.LastError)))
	if res.Applied {
		fmt.Fprintf(g.stdout, "  it left the outbox for the parked table; its failure record was deleted; the relayers were woken\n")
	} else {
		fmt.Fprintf(g.stdout, "  it would leave the outbox for the parked table, and its failure record would be deleted\n")
	}
	be := "would be"
	if res.Applied {
		be = "are now"
	}
	if res.LaterPending > 0 {
		fmt.Fprintf(g.stdout, "  order: the aggregate's %d later pending event(s) %s published without it, and so are those emitted later: "+
			"a deliberate break of aggregate %s's order\n", res.LaterPending, be, ev.AggregateID)
	} else {
		fmt.Fprintf(g.stdout, "  order: the aggregate's events emitted from now on %s published without it: a deliberate break of aggregate %s's order\n",
			be, ev.AggregateID)
	}
	if res.Applied {
		fmt.Fprintf(g.stdout, "  'outbox events unpark %d' puts it back\n", ev.ID)
	} else {
		dryRunNote(g, "park it")
	}
	return nil
}

func newEventsUnparkCmd(g *globals) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "unpark ID",
		Short: "Put a parked event back into the outbox under its original id",
		Long: `unpark moves a parked event back into the outbox under its original id,
pending, with its original created_at, deletes its parked row, and wakes
the relayers.

It is then the oldest pending row of its aggregate, so it is published next
for that aggregate: after the aggregate's events that went out while it was
parked, out of its original order. Its requeued_at is set to now, so the
lag and the stuck-row watchdog count its wait from the unpark. If what made
it fail is not fixed, it fails and is held again. Without --yes, unpark
prints what it would do and changes nothing.

Run it as the outbox table's owner (or a member of the owner's role): the
row goes back whole, as it was written, and the insert guard lets only the
owner put a row back past its checks.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			id, err := parseEventID(args[0])
			if err != nil {
				return err
			}
			ctx := c.Context()
			log, pool, t, err := g.verbSession(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := ops.Unpark(ctx, pool, ops.UnparkConfig{Tables: t, ID: id, Apply: yes, Logger: log})
			if err != nil {
				return err
			}
			ev := res.Event
			verb := "would unpark"
			if res.Applied {
				verb = "unparked"
			}
			fmt.Fprintf(g.stdout, "%s event %d (aggregate %s, %s, created %s), parked %s with reason %q\n",
				verb, ev.ID, ev.AggregateID, clip.Field(ev.Type), fmtTime(ev.CreatedAt), fmtTime(ev.ParkedAt), oneLine(ev.Reason))
			fmt.Fprintf(g.stdout, "  last error: %s\n", dash(oneLine(ev.LastError)))
			be := "would be"
			if res.Applied {
				be = "is"
			}
			before := ""
			if res.LaterPending > 0 {
				before = fmt.Sprintf(" before its %d later pending event(s), and", res.LaterPending)
			}
			fmt.Fprintf(g.stdout, "  it %s back in the outbox under id %d, pending, the oldest pending row of its aggregate: published next for it,%s "+
				"after those that went out while it was parked (out of its original order)\n", be, ev.ID, before)
			fmt.Fprintf(g.stdout, "  its created_at %s is kept; the lag and the watchdog count its wait from the unpark (requeued_at)\n", fmtTime(ev.CreatedAt))
			if !res.Applied {
				dryRunNote(g, "unpark it")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "unpark it (without it: a dry run)")
	return cmd
}

func newEventsReplayCmd(g *globals) *cobra.Command {
	var (
		cfg       ops.ReplayConfig
		aggregate string
		yes       bool
	)
	cmd := &cobra.Command{
		Use:   "replay --from-id A --to-id B [--type T] [--aggregate UUID]",
		Short: "Set dispatched events back to pending so the relayers publish them again",
		Long: `replay sets the dispatched events with ids from --from-id to --to-id (both
included; with --type and --aggregate, only those) back to pending, so the
relayers publish them again: for a new consumer, or one that lost its
data. Consumers deduplicate by event_id, so those that processed an event
skip it.

It works through the range in batches of --batch-size rows of the primary
key, each its own short transaction that wakes the relayers, never one
large update. Each replayed row keeps its created_at and gets requeued_at =
now(): the lag, the stuck-row watchdog and the commit-to-publish latency
measure how long it has waited for the replay, not its age (and retention
cleanup, which goes by created_at, is not held up); a failure record left from a
replayed row's earlier life is deleted. Pending rows in the range are left
as they are. Rows deleted by retention cleanup cannot be replayed.
Within the replay, each aggregate's events go out in id order; an event
emitted while a replay runs can go out between two chunks.

Without --yes, replay counts the rows it would replay and changes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runEventsReplay(c.Context(), g, cfg, aggregate, yes, flagAsGiven(c.Flags(), "batch-size", "chunk"))
		},
	}
	f := cmd.Flags()
	f.Int64Var(&cfg.FromID, "from-id", 0, "first id of the range (required)")
	f.Int64Var(&cfg.ToID, "to-id", 0, "last id of the range, included (required)")
	f.StringVar(&cfg.Type, "type", "", "replay only events of this type")
	f.StringVar(&aggregate, "aggregate", "", "replay only events of this aggregate")
	f.IntVar(&cfg.ChunkSize, "batch-size", ops.DefaultReplayChunk, "rows of the primary key per transaction")
	deprecatedAlias(f, "batch-size", "chunk")
	f.BoolVar(&yes, "yes", false, "replay them (without it: a dry run)")
	return cmd
}

// runEventsReplay sets the dispatched events cfg selects back to pending;
// without yes, it counts them.
func runEventsReplay(ctx context.Context, g *globals, cfg ops.ReplayConfig, aggregate string, yes bool, batchFlag string) error {
	switch {
	case cfg.FromID <= 0 || cfg.ToID <= 0:
		return fmt.Errorf("replay needs a range: --from-id and --to-id, positive ids (both included)")
	case cfg.FromID > cfg.ToID:
		return fmt.Errorf("--from-id %d is above --to-id %d: the range is inverted", cfg.FromID, cfg.ToID)
	case cfg.ChunkSize <= 0 || cfg.ChunkSize > 1_000_000:
		return fmt.Errorf("%s %d: use 1 to 1000000 rows per transaction", batchFlag, cfg.ChunkSize)
	}
	var err error
	if cfg.AggregateID, err = parseAggregate("--aggregate", aggregate); err != nil {
		return err
	}
	log, pool, t, err := g.verbSession(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Tables, cfg.Logger, cfg.Apply = t, log, yes
	res, err := ops.Replay(ctx, pool, cfg)
	if err != nil {
		return err
	}
	var filters []string
	if cfg.Type != "" {
		filters = append(filters, "type "+clip.Field(cfg.Type))
	}
	if cfg.AggregateID != uuid.Nil {
		filters = append(filters, "aggregate "+cfg.AggregateID.String())
	}
	scope := fmt.Sprintf("ids %d to %d", cfg.FromID, cfg.ToID)
	if len(filters) > 0 {
		scope += " (" + strings.Join(filters, ", ") + ")"
	}
	// The ids found, when they are not the range's ends.
	found := ""
	switch {
	case res.Rows == 0 || res.FirstID == cfg.FromID && res.LastID == cfg.ToID:
	case res.FirstID == res.LastID:
		found = fmt.Sprintf(" (id %d)", res.FirstID)
	default:
		found = fmt.Sprintf(" (ids %d to %d of them)", res.FirstID, res.LastID)
	}
	switch {
	case res.Rows == 0:
		fmt.Fprintf(g.stdout, "no dispatched event in %s: nothing to replay\n", scope)
	case res.Applied:
		fmt.Fprintf(g.stdout, "replayed %d dispatched event(s) in %s%s, in %d chunk(s): pending again, each with its created_at kept and requeued_at = now(); the relayers were woken\n",
			res.Rows, scope, found, res.Chunks)
	default:
		fmt.Fprintf(g.stdout, "would replay %d dispatched event(s) in %s%s, in chunks of %d rows: set back to pending, each with its created_at kept and requeued_at = now()\n",
			res.Rows, scope, found, cfg.ChunkSize)
	}
	if res.Pending > 0 {
		fmt.Fprintf(g.stdout, "  %d event(s) in the range are pending already and are left as they are\n", res.Pending)
	}
	if res.OldestID == 0 {
		fmt.Fprintf(g.stdout, "  the outbox is empty: rows deleted by retention cleanup cannot be replayed\n")
	} else if cfg.FromID < res.OldestID {
		fmt.Fprintf(g.stdout, "  no row below id %d is left in the outbox: ids %d to %d were deleted by retention cleanup (or never written) and cannot be replayed\n",
			res.OldestID, cfg.FromID, min(res.OldestID-1, cfg.ToID))
	}
	if res.Rows > 0 {
		fmt.Fprintf(g.stdout, "  consumers deduplicate by event_id: those that processed these events skip them\n")
	}
	if !res.Applied && res.Rows > 0 {
		dryRunNote(g, "replay them")
	}
	return nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// verbSession is what a verb that changes something needs: the logger it
// reports its change to, and a pool on the migrated outbox.
func (g *globals) verbSession(ctx context.Context) (*slog.Logger, *pgxpool.Pool, outbox.Tables, error) {
	log, err := g.logger()
	if err != nil {
		return nil, nil, outbox.Tables{}, err
	}
	pool, t, err := g.opsPool(ctx)
	return log, pool, t, err
}
