package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/migrate"
)

// UnparkConfig says which parked event Unpark puts back.
type UnparkConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// ID is the parked event. Required.
	ID int64
	// Apply puts it back; otherwise Unpark only reports what it would do.
	// Defaults to false: a dry run.
	Apply bool
	// Logger receives the Info line of an applied run. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c UnparkConfig) WithDefaults() UnparkConfig {
	c.Tables = c.Tables.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a bad table name or id.
func (c UnparkConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	if c.ID <= 0 {
		return fmt.Errorf("ops: event id %d: ids are positive", c.ID)
	}
	return nil
}

// UnparkResult is what Unpark did, or would do.
type UnparkResult struct {
	// Applied is false for a dry run.
	Applied bool
	// Event is the parked row, as it was.
	Event ParkedEvent
	// LaterPending counts the pending rows of its aggregate after it: it is
	// published before them.
	LaterPending int64
}

// Unpark moves a parked event back into the outbox under its original id,
// pending, with its created_at kept, deletes its parked row, and NOTIFYs
// the relayers. Being the oldest pending row of its aggregate (its id is
// older than any row emitted since), it is published next for that
// aggregate: after the rows of the aggregate that went out while it was
// parked, out of its original order. Its requeued_at is set to now(), so
// the lag and the watchdog count its wait from the unpark, not its age.
//
// Only the table's owner, or a member of the owner's role, may write a row
// under an id the sequence did not just draw (the insert guard, migration
// 7): run Unpark as that role.
//
// It returns an error wrapping ErrEventNotParked (the event is in the
// outbox) or ErrEventNotFound.
func Unpark(ctx context.Context, db outbox.DB, cfg UnparkConfig) (UnparkResult, error) {
	res := UnparkResult{Applied: cfg.Apply}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	t := cfg.Tables
	log := cfg.Logger.With("outbox", t.OutboxIdent())

	tx, err := db.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("ops: unpark: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	ev := ParkedEvent{ID: cfg.ID}
	q := render(parkedSQL, t)
	if cfg.Apply {
		q = render(parkedForUpdateSQL, t)
	}
	var lastErr *string
	err = tx.QueryRow(ctx, q, cfg.ID).Scan(&ev.AggregateID, &ev.Type, &ev.CreatedAt, &ev.ParkedAt, &ev.Reason, &lastErr)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		d, err := showEvent(ctx, tx, t, cfg.ID, 0)
		if err != nil {
			return res, err
		}
		return res, eventErr(ErrEventNotParked, "event %d is not parked: it is in the outbox, %s; nothing to do", cfg.ID, d.State)
	case err != nil:
		return res, fmt.Errorf("ops: unpark: read event %d from %s: %w", cfg.ID, migrate.ParkedIdent(t), err)
	}
	if lastErr != nil {
		ev.LastError = *lastErr
	}
	res.Event = ev
	if err := tx.QueryRow(ctx, render(laterPendingSQL, t), ev.AggregateID, cfg.ID).Scan(&res.LaterPending); err != nil {
		return res, fmt.Errorf("ops: unpark: count the later rows of aggregate %s: %w", ev.AggregateID, err)
	}
	if !cfg.Apply {
		return res, nil
	}
	unpark, err := binaryVariant(ctx, tx, t, unparkSQL, unparkBinarySQL)
	if err != nil {
		return res, err
	}
	if _, err := tx.Exec(ctx, unpark, cfg.ID); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
			return res, fmt.Errorf("ops: unpark: %s already has a row with id %d (inserted by hand?); "+
				"compare it with the parked row (`outbox events show %d` shows the outbox one) and delete one of them", t.OutboxIdent(), cfg.ID, cfg.ID)
		}
		if errors.As(err, &pgErr) && pgErr.Code == "428C9" { // generated_always: the guard refused the old id
			return res, fmt.Errorf("ops: unpark: the insert guard of %s refused event %d under its own id: only the table's owner "+
				"(or a member of its role) may put a row back; run unpark as that role", t.OutboxIdent(), cfg.ID)
		}
		return res, fmt.Errorf("ops: unpark event %d into %s: %w", cfg.ID, t.OutboxIdent(), err)
	}
	if err := notifyAndCommit(ctx, tx, t); err != nil {
		return res, fmt.Errorf("ops: unpark: %w", err)
	}
	log.Info("unparked outbox event; it is published next for its aggregate, out of its original order",
		"verb", "unpark", "event_id", ev.ID, "aggregate_id", ev.AggregateID, "type", ev.Type, "parked_reason", ev.Reason,
		"later_pending", res.LaterPending)
	return res, nil
}
