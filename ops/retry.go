package ops

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
)

// RetryConfig says whose holds Retry lifts: one event's, or every held
// event's of one aggregate. Set exactly one of EventID and AggregateID.
type RetryConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// EventID lifts the hold of this event.
	EventID int64
	// AggregateID lifts the holds of every pending event of this aggregate.
	AggregateID uuid.UUID
	// Apply lifts them; otherwise Retry only reports what it would lift.
	// Defaults to false: a dry run.
	Apply bool
	// Logger receives the Info line of an applied run. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c RetryConfig) WithDefaults() RetryConfig {
	c.Tables = c.Tables.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a bad table name, or not exactly one of EventID and
// AggregateID.
func (c RetryConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	switch {
	case (c.EventID != 0) == (c.AggregateID != uuid.Nil):
		return errors.New("ops: retry needs either an event id or an aggregate id, not both and not neither")
	case c.EventID < 0:
		return fmt.Errorf("ops: event id %d: ids are positive", c.EventID)
	}
	return nil
}

// RetryResult is what Retry lifted, or would lift.
type RetryResult struct {
	// Applied is false for a dry run.
	Applied bool
	// Holds are the holds lifted (or that would be), in event id order.
	// Empty when there is nothing to do.
	Holds []relay.Hold
	// BlockedBy is set when the event Retry was given is not held but
	// waits behind this earlier pending row of its aggregate;
	// BlockedByHold is that row's hold, when it has one: the hold to lift.
	BlockedBy     int64
	BlockedByHold *relay.Hold
}

// Retry lifts holds: it sets held_until to NULL on the failures rows of
// the event (or aggregate) whose hold is active, so that every running
// relayer tries the aggregate again at its next claim, and NOTIFYs them.
// The failures' history (reason, error, attempts) stays.
//
// Retrying one event returns an error wrapping ErrEventNotFound,
// ErrEventDispatched (replay it instead) or ErrEventParked (unpark it
// instead). A pending event that is not held is nothing to do: the result
// has no Holds, and says which row it waits behind, if any.
func Retry(ctx context.Context, db outbox.DB, cfg RetryConfig) (RetryResult, error) {
	res := RetryResult{Applied: cfg.Apply}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	t := cfg.Tables
	byEvent := cfg.EventID != 0
	log := cfg.Logger.With("outbox", t.OutboxIdent())

	tx, err := db.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("ops: retry: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	holds, arg := holdsSQL[0], any(cfg.AggregateID)
	if byEvent {
		holds, arg = holdsSQL[1], cfg.EventID
		held, err := retryEventHeld(ctx, tx, t, cfg.EventID, &res)
		if err != nil || !held {
			return res, err
		}
	}

	stmt := holds[0]
	if cfg.Apply {
		stmt = holds[1]
	}
	res.Holds, err = readHolds(ctx, tx, t, stmt, arg)
	if err != nil {
		return res, err
	}
	if !cfg.Apply || len(res.Holds) == 0 {
		return res, nil
	}
	// RETURNING comes in no particular order.
	slices.SortFunc(res.Holds, func(a, b relay.Hold) int { return cmp.Compare(a.EventID, b.EventID) })
	if err := notifyAndCommit(ctx, tx, t); err != nil {
		return res, fmt.Errorf("ops: retry: %w", err)
	}
	logRetry(log, res.Holds, byEvent, cfg.AggregateID)
	return res, nil
}

// retryEventHeld reports whether the event id is pending with an active
// hold. It returns an error for an event that is dispatched, parked or
// not found; for a pending one that is not held, it sets res.BlockedBy
// (and res.BlockedByHold) to the row it waits behind, if any.
func retryEventHeld(ctx context.Context, tx pgx.Tx, t outbox.Tables, id int64, res *RetryResult) (bool, error) {
	d, err := showEvent(ctx, tx, t, id, 0)
	if err != nil {
		return false, err
	}
	switch d.State {
	case EventDispatched:
		return false, eventErr(ErrEventDispatched, "event %d was dispatched at %s: there is no hold to lift. To publish it again, replay it "+
			"(Replay, `outbox events replay`) from id %d to id %d", d.ID, fmtTime(d.DispatchedAt), d.ID, d.ID)
	case EventParked:
		return false, eventErr(ErrEventParked, "event %d is parked (since %s, reason %q): relayers do not see it. "+
			"To send it again, unpark it: `outbox events unpark %d`", d.ID, fmtTime(d.Parked.ParkedAt), d.Parked.Reason, d.ID)
	}
	if d.Failure != nil && d.Failure.HoldActive {
		return true, nil
	}
	res.BlockedBy = d.BlockedBy
	if d.BlockedBy != 0 {
		b, err := showEvent(ctx, tx, t, d.BlockedBy, 0)
		if err != nil && !errors.Is(err, ErrEventNotFound) {
			return false, err
		}
		if err == nil && b.Failure != nil && b.Failure.HoldActive {
			res.BlockedByHold = &relay.Hold{EventID: b.ID, AggregateID: b.AggregateID, Type: b.Type, Reason: b.Failure.Reason,
				Err: b.Failure.Error, Attempts: b.Failure.Attempts, Until: b.Failure.HeldUntil}
		}
	}
	return false, nil
}

// readHolds runs stmt, one of holdsSQL's (read the holds, or lift them),
// for arg, an event or aggregate id, and returns the holds it reports.
func readHolds(ctx context.Context, tx pgx.Tx, t outbox.Tables, stmt string, arg any) ([]relay.Hold, error) {
	rows, err := tx.Query(ctx, render(stmt, t), arg)
	if err != nil {
		return nil, fmt.Errorf("ops: retry: read holds in %s: %w", migrate.FailuresIdent(t), err)
	}
	holds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (relay.Hold, error) {
		var h relay.Hold
		err := r.Scan(&h.EventID, &h.AggregateID, &h.Type, &h.Reason, &h.Err, &h.Attempts, &h.Until)
		return h, err
	})
	if err != nil {
		return holds, fmt.Errorf("ops: retry: lift holds in %s: %w", migrate.FailuresIdent(t), err)
	}
	return holds, nil
}

// logRetry logs the Info line of an applied Retry that lifted holds.
func logRetry(log *slog.Logger, holds []relay.Hold, byEvent bool, aggregateID uuid.UUID) {
	ids := make([]int64, len(holds))
	for i, h := range holds {
		ids[i] = h.EventID
	}
	args := []any{"verb", "retry", "event_ids", ids}
	if !byEvent {
		args = append(args, "aggregate_id", aggregateID)
	}
	log.Info("lifted holds on outbox events; relayers retry them at their next claim", args...)
}
