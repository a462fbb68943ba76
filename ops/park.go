package ops

import (
	"context"
	"errors"
	"fmt"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/durations"
	"github.com/pgoutbox/outbox/migrate"
)

// DefaultParkLockTimeout is how long Park waits for the row's lock.
const DefaultParkLockTimeout = 5 * time.Second

// ParkConfig says which event Park takes out of the outbox, and why.
type ParkConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// ID is the pending event to park. Required.
	ID int64
	// Reason says why, for whoever unparks it. Required.
	Reason string
	// LockTimeout bounds the wait for the row's lock: a relayer may be
	// publishing it. Defaults to DefaultParkLockTimeout (5s).
	LockTimeout time.Duration
	// Apply parks it; otherwise Park only reports what it would do.
	// Defaults to false: a dry run.
	Apply bool
	// Logger receives the Info line of an applied run. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with its zero fields set to their defaults.
// A negative LockTimeout is left for Validate to refuse.
func (c ParkConfig) WithDefaults() ParkConfig {
	c.Tables = c.Tables.WithDefaults()
	durations.Fill(c.durations())
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c *ParkConfig) durations() []durations.Default {
	return []durations.Default{{Name: "LockTimeout", V: &c.LockTimeout, Def: DefaultParkLockTimeout}}
}

// Validate reports a bad table name, id, Reason or LockTimeout.
func (c ParkConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	if c.ID <= 0 {
		return fmt.Errorf("ops: event id %d: ids are positive", c.ID)
	}
	if strings.TrimSpace(c.Reason) == "" {
		return errors.New("ops: park needs a reason: it is kept with the parked row for whoever unparks it")
	}
	if why := pgtext.Invalid(c.Reason); why != "" {
		return fmt.Errorf("ops: park reason %s; write it as plain text", why)
	}
	return durations.Check("park", c.durations())
}

// ParkedEvent is an event in the parked table (or, in a dry run, one that
// would be).
type ParkedEvent struct {
	ID          int64
	AggregateID uuid.UUID
	Type        string
	CreatedAt   time.Time
	// ParkedAt is zero in a dry run of Park.
	ParkedAt time.Time
	Reason   string
	// LastError is the failure recorded for it when it was parked; "" for
	// none.
	LastError string
}

// ParkResult is what Park did, or would do.
type ParkResult struct {
	// Applied is false for a dry run.
	Applied bool
	Event   ParkedEvent
	// LaterPending counts the later pending rows of the event's aggregate:
	// parked, the event no longer holds them back, so they are published
	// before it.
	LaterPending int64
}

// Park takes a pending event out of the outbox into the parked table
// (migrate.ParkedIdent), with its reason and last recorded error, and
// deletes its failure record, in one transaction; then NOTIFYs the
// relayers. It first locks the row, waiting at most LockTimeout (a relayer
// may be publishing it right now; then it returns an error wrapping
// ErrEventLocked).
//
// Parking breaks the aggregate's order on purpose: the later events of the
// aggregate, held back behind this one until now, are published without
// it. Unpark puts it back.
//
// It returns an error wrapping ErrEventNotFound, ErrEventDispatched (a
// published row cannot be parked) or ErrEventParked (already parked).
func Park(ctx context.Context, db outbox.DB, cfg ParkConfig) (ParkResult, error) {
	res := ParkResult{Applied: cfg.Apply}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	t := cfg.Tables
	log := cfg.Logger.With("outbox", t.OutboxIdent())

	tx, err := db.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("ops: park: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	ev, err := lockParkEvent(ctx, tx, t, cfg)
	if err != nil {
		return res, err
	}
	if err := tx.QueryRow(ctx, render(laterPendingSQL, t), ev.AggregateID, cfg.ID).Scan(&res.LaterPending); err != nil {
		return res, fmt.Errorf("ops: park: count the later rows of aggregate %s: %w", ev.AggregateID, err)
	}
	if !cfg.Apply {
		var lastErr *string
		err := tx.QueryRow(ctx, render(lastErrorSQL, t), cfg.ID).Scan(&lastErr)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return res, fmt.Errorf("ops: park: read the failure of event %d: %w", cfg.ID, err)
		}
		if lastErr != nil {
			ev.LastError = *lastErr
		}
		res.Event = ev
		return res, nil
	}
	var lastErr *string
	park, err := binaryVariant(ctx, tx, t, parkSQL, parkBinarySQL)
	if err != nil {
		return res, err
	}
	if err := tx.QueryRow(ctx, park, cfg.ID, cfg.Reason).Scan(&ev.ParkedAt, &lastErr); err != nil {
		return res, fmt.Errorf("ops: park event %d into %s: %w", cfg.ID, migrate.ParkedIdent(t), err)
	}
	if lastErr != nil {
		ev.LastError = *lastErr
	}
	res.Event = ev
	if err := notifyAndCommit(ctx, tx, t); err != nil {
		return res, fmt.Errorf("ops: park: %w", err)
	}
	log.Info("parked outbox event; the later events of its aggregate are published without it",
		"verb", "park", "event_id", ev.ID, "aggregate_id", ev.AggregateID, "type", ev.Type, "reason", ev.Reason,
		"later_pending", res.LaterPending)
	return res, nil
}

// lockParkEvent reads the event Park was given, in tx, and checks that it
// is pending. An applied run locks its row first, waiting at most
// cfg.LockTimeout.
func lockParkEvent(ctx context.Context, tx pgx.Tx, t outbox.Tables, cfg ParkConfig) (ParkedEvent, error) {
	ev := ParkedEvent{ID: cfg.ID, Reason: cfg.Reason}
	var dispatched *time.Time
	q := render(lockPendingSQL, t)
	if cfg.Apply {
		q = render(lockPendingForUpdateSQL, t)
		if _, err := tx.Exec(ctx, setLockTimeoutSQL, fmt.Sprintf("%dms", max(cfg.LockTimeout.Milliseconds(), 1))); err != nil {
			return ev, fmt.Errorf("ops: park: set lock_timeout: %w", err)
		}
	}
	err := tx.QueryRow(ctx, q, cfg.ID).Scan(&ev.AggregateID, &ev.Type, &ev.CreatedAt, &dispatched)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		return ev, eventErr(ErrEventLocked, "event %d is locked by another transaction, most likely a relayer publishing it right now "+
			"(waited %s); try again in a few seconds", cfg.ID, cfg.LockTimeout)
	case errors.Is(err, pgx.ErrNoRows):
		d, err := showEvent(ctx, tx, t, cfg.ID, 0)
		if err != nil {
			return ev, err
		}
		if d.State != EventParked {
			return ev, fmt.Errorf("ops: park: event %d moved while it was being read (unparked just now?); try again", cfg.ID)
		}
		return ev, eventErr(ErrEventParked, "event %d is already parked (since %s, reason %q); nothing to do",
			cfg.ID, fmtTime(d.Parked.ParkedAt), d.Parked.Reason)
	case err != nil:
		return ev, fmt.Errorf("ops: park: read event %d: %w", cfg.ID, err)
	case dispatched != nil:
		return ev, eventErr(ErrEventDispatched, "event %d was dispatched at %s: it is published, so it cannot be parked", cfg.ID, fmtTime(*dispatched))
	}
	return ev, nil
}
