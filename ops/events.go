package ops

// The operator's verbs on single events: show, retry, park, unpark and
// replay (`outbox events ...`). Each mutating verb is a dry run unless its
// config says Apply: the dry run reads what would change and changes
// nothing; the applied run changes it in a transaction, NOTIFYs the
// relayers on the outbox's channel in that same transaction (so they wake
// when the change is visible) and logs one Info line naming the ids.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"github.com/pgoutbox/outbox/migrate"
)

// Beginner opens a transaction; *pgxpool.Pool and *pgx.Conn have it (a
// pgx.Tx too, which runs the verb in a savepoint: Replay's chunks then
// commit only with the caller's transaction).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Errors the operator verbs return, wrapped in a message that says which
// event and what to do; test with errors.Is.
var (
	// ErrEventNotFound: the id is neither in the outbox nor parked.
	ErrEventNotFound = errors.New("ops: event not found")
	// ErrEventDispatched: the verb needs a pending row and the row was
	// dispatched.
	ErrEventDispatched = errors.New("ops: event already dispatched")
	// ErrEventParked: the verb needs the row in the outbox and it is parked.
	ErrEventParked = errors.New("ops: event is parked")
	// ErrEventNotParked: Unpark was given a row that is not parked.
	ErrEventNotParked = errors.New("ops: event is not parked")
	// ErrEventLocked: Park could not lock the row within its LockTimeout,
	// most likely because a relayer is publishing it.
	ErrEventLocked = errors.New("ops: event is locked by another transaction")
)

// eventError carries one of the errors above with a message for the
// operator.
type eventError struct {
	kind error
	msg  string
}

func (e *eventError) Error() string { return e.msg }
func (e *eventError) Unwrap() error { return e.kind }

func eventErr(kind error, format string, args ...any) error {
	return &eventError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// EventState says where an event is.
type EventState string

// Event states.
const (
	// EventPending rows are in the outbox waiting to be published.
	EventPending EventState = "pending"
	// EventDispatched rows are in the outbox, published.
	EventDispatched EventState = "dispatched"
	// EventParked rows were taken out of the outbox by Park.
	EventParked EventState = "parked"
)

// DefaultPreviewBytes is how much of a payload ShowEvent returns unless
// asked for all of it.
const DefaultPreviewBytes = 500

// ShowConfig says which event ShowEvent reads.
type ShowConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// ID is the event's id (the event_id header). Required.
	ID int64
	// PreviewBytes caps EventDetail.Payload; negative returns the whole
	// payload. Defaults to DefaultPreviewBytes.
	PreviewBytes int
}

// EventDetail is what ShowEvent found about one event.
type EventDetail struct {
	ID          int64
	AggregateID uuid.UUID
	Type        string
	State       EventState
	CreatedAt   time.Time
	// DispatchedAt is zero unless State is EventDispatched.
	DispatchedAt time.Time
	// PayloadBytes is the length of the payload as it is published: the
	// text of its JSONB value.
	PayloadBytes int
	// RecordBytes is the most bytes the event's Kafka record batch takes
	// when it travels alone (outbox.RecordSize, without an event_source
	// header): what the topic's max.message.bytes is compared with. Zero
	// when the headers are not a JSON object of strings (such a row cannot
	// be published).
	RecordBytes int
	// Payload is the payload's JSON text, whole or cut to PreviewBytes at a
	// character boundary (then PayloadTruncated is set).
	Payload          string
	PayloadTruncated bool
	// Headers is the row's headers column as JSON text; nil when NULL.
	Headers json.RawMessage
	// Failure is the last permanent failure a relayer recorded for the
	// event; nil when none is recorded.
	Failure *EventFailure
	// BlockedBy is, for a pending row, the earliest pending row of its
	// aggregate before it: the row waits behind that one to keep the
	// aggregate's order. Zero when it is its aggregate's oldest pending
	// row, or not pending.
	BlockedBy int64
	// Parked is set when State is EventParked.
	Parked *ParkInfo
}

// EventFailure is a row of the failures table (migrate.FailuresIdent).
type EventFailure struct {
	// Reason is a short code: too_large, undecodable, invalid_topic,
	// reserved_header, broker_refused.
	Reason string
	// Error is the whole message of the last failure.
	Error                   string
	Attempts                int
	FirstFailedAt, FailedAt time.Time
	// HeldUntil is when the hold on the event's aggregate ends; zero when
	// no hold is set (lifted by Retry).
	HeldUntil time.Time
	// HoldActive: HeldUntil is in the future and the row is pending, so
	// every relayer skips its aggregate until then.
	HoldActive bool
}

// ParkInfo is why and when an event was parked.
type ParkInfo struct {
	ParkedAt time.Time
	Reason   string
	// LastError is the failure recorded when it was parked; "" for none.
	LastError string
}

// ShowEvent reads one event: its row in the outbox with its recorded
// failure and the row it waits behind, or else its parked row. It returns
// an error wrapping ErrEventNotFound when the id is in neither.
//
// It runs up to two statements; for a consistent view of an event that an
// operator may be moving at the same time, pass a REPEATABLE READ
// transaction as db (the CLI does).
func ShowEvent(ctx context.Context, db Queryer, cfg ShowConfig) (EventDetail, error) {
	if err := cfg.Tables.Validate(); err != nil {
		return EventDetail{}, err
	}
	t := cfg.Tables.WithDefaults()
	if cfg.ID <= 0 {
		return EventDetail{}, fmt.Errorf("ops: event id %d: ids are positive; take it from the event_id header or `outbox watchdog`", cfg.ID)
	}
	preview := cfg.PreviewBytes
	if preview == 0 {
		preview = DefaultPreviewBytes
	}
	return showEvent(ctx, db, t, cfg.ID, preview)
}

func showEvent(ctx context.Context, db Queryer, t outbox.Tables, id int64, preview int) (EventDetail, error) {
	chars := preview
	if preview < 0 {
		chars = -1
	}
	d := EventDetail{ID: id}
	var (
		dispatched *time.Time
		headers    *string
		hasFailure bool
		reason     *string
		errText    *string
		attempts   *int
		first      *time.Time
		failed     *time.Time
		heldUntil  *time.Time
		blockedBy  *int64
		f          EventFailure
	)
	err := db.QueryRow(ctx, render(showSQL, t), id, chars).Scan(&d.ID, &d.AggregateID, &d.Type, &d.CreatedAt, &dispatched,
		&d.PayloadBytes, &d.Payload, &headers,
		&hasFailure, &reason, &errText, &attempts, &first, &failed, &heldUntil, &f.HoldActive, &blockedBy)
	switch {
	case err == nil:
		d.State = EventPending
		if dispatched != nil {
			d.State, d.DispatchedAt = EventDispatched, *dispatched
		}
		if hasFailure {
			f.Reason, f.Error, f.Attempts, f.FirstFailedAt, f.FailedAt = *reason, *errText, *attempts, *first, *failed
			if heldUntil != nil {
				f.HeldUntil = *heldUntil
			}
			d.Failure = &f
		}
		if blockedBy != nil {
			d.BlockedBy = *blockedBy
		}
	case errors.Is(err, pgx.ErrNoRows):
		var p ParkInfo
		var lastErr *string
		err = db.QueryRow(ctx, render(showParkedSQL, t), id, chars).Scan(&d.ID, &d.AggregateID, &d.Type, &d.CreatedAt,
			&d.PayloadBytes, &d.Payload, &headers, &p.ParkedAt, &p.Reason, &lastErr)
		if errors.Is(err, pgx.ErrNoRows) {
			return d, notFound(t, id)
		}
		if err != nil {
			return d, fmt.Errorf("ops: read event %d from %s: %w", id, migrate.ParkedIdent(t), err)
		}
		if lastErr != nil {
			p.LastError = *lastErr
		}
		d.State, d.Parked = EventParked, &p
	default:
		return d, fmt.Errorf("ops: read event %d from %s: %w", id, t.OutboxIdent(), err)
	}
	if headers != nil {
		d.Headers = json.RawMessage(*headers)
	}
	if preview >= 0 && len(d.Payload) > preview {
		d.Payload = cutUTF8(d.Payload, preview)
	}
	d.PayloadTruncated = len(d.Payload) < d.PayloadBytes
	var hm map[string]string
	if d.Headers == nil || json.Unmarshal(d.Headers, &hm) == nil {
		d.RecordBytes = outbox.KafkaRouting{}.RecordSize(d.ID, d.Type, d.PayloadBytes, hm, "")
	}
	return d, nil
}

// cutUTF8 cuts s to at most n bytes without splitting a character.
func cutUTF8(s string, n int) string {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func notFound(t outbox.Tables, id int64) error {
	return eventErr(ErrEventNotFound, "event %d is neither in %s nor parked in %s: no such id was written, "+
		"or retention cleanup deleted it after it was dispatched (dispatched rows are kept for the cleanup's retention, 7 days by default)",
		id, t.OutboxIdent(), migrate.ParkedIdent(t))
}

// Hold is an active hold on an event's aggregate: a failures row whose
// held_until is in the future while the event is pending.
type Hold struct {
	EventID     int64
	AggregateID uuid.UUID
	Type        string
	Reason      string
	Error       string
	Attempts    int
	// HeldUntil is when the hold would have ended.
	HeldUntil time.Time
}

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

// RetryResult is what Retry lifted, or would lift.
type RetryResult struct {
	// Applied is false for a dry run.
	Applied bool
	// Holds are the holds lifted (or that would be), in event id order.
	// Empty when there is nothing to do.
	Holds []Hold
	// BlockedBy is set when the event Retry was given is not held but
	// waits behind this earlier pending row of its aggregate;
	// BlockedByHold is that row's hold, when it has one: the hold to lift.
	BlockedBy     int64
	BlockedByHold *Hold
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
func Retry(ctx context.Context, db Beginner, cfg RetryConfig) (RetryResult, error) {
	res := RetryResult{Applied: cfg.Apply}
	if err := cfg.Tables.Validate(); err != nil {
		return res, err
	}
	t := cfg.Tables.WithDefaults()
	byEvent := cfg.EventID != 0
	switch {
	case byEvent == (cfg.AggregateID != uuid.Nil):
		return res, errors.New("ops: retry needs either an event id or an aggregate id, not both and not neither")
	case cfg.EventID < 0:
		return res, fmt.Errorf("ops: event id %d: ids are positive", cfg.EventID)
	}
	log := logger(cfg.Logger, t)

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
	slices.SortFunc(res.Holds, func(a, b Hold) int { return cmp.Compare(a.EventID, b.EventID) })
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
			res.BlockedByHold = &Hold{EventID: b.ID, AggregateID: b.AggregateID, Type: b.Type, Reason: b.Failure.Reason,
				Error: b.Failure.Error, Attempts: b.Failure.Attempts, HeldUntil: b.Failure.HeldUntil}
		}
	}
	return false, nil
}

// readHolds runs stmt, one of holdsSQL's (read the holds, or lift them),
// for arg, an event or aggregate id, and returns the holds it reports.
func readHolds(ctx context.Context, tx pgx.Tx, t outbox.Tables, stmt string, arg any) ([]Hold, error) {
	rows, err := tx.Query(ctx, render(stmt, t), arg)
	if err != nil {
		return nil, fmt.Errorf("ops: retry: read holds in %s: %w", migrate.FailuresIdent(t), err)
	}
	holds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Hold, error) {
		var h Hold
		err := r.Scan(&h.EventID, &h.AggregateID, &h.Type, &h.Reason, &h.Error, &h.Attempts, &h.HeldUntil)
		return h, err
	})
	if err != nil {
		return holds, fmt.Errorf("ops: retry: lift holds in %s: %w", migrate.FailuresIdent(t), err)
	}
	return holds, nil
}

// logRetry logs the Info line of an applied Retry that lifted holds.
func logRetry(log *slog.Logger, holds []Hold, byEvent bool, aggregateID uuid.UUID) {
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
func Park(ctx context.Context, db Beginner, cfg ParkConfig) (ParkResult, error) {
	res := ParkResult{Applied: cfg.Apply}
	if err := cfg.Tables.Validate(); err != nil {
		return res, err
	}
	t := cfg.Tables.WithDefaults()
	if cfg.ID <= 0 {
		return res, fmt.Errorf("ops: event id %d: ids are positive", cfg.ID)
	}
	if strings.TrimSpace(cfg.Reason) == "" {
		return res, errors.New("ops: park needs a reason: it is kept with the parked row for whoever unparks it")
	}
	if why := pgtext.Invalid(cfg.Reason); why != "" {
		return res, fmt.Errorf("ops: park reason %s; write it as plain text", why)
	}
	if cfg.LockTimeout < 0 {
		return res, fmt.Errorf("ops: park LockTimeout is %s; use a positive duration, or 0 for the default %s", cfg.LockTimeout, DefaultParkLockTimeout)
	}
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = DefaultParkLockTimeout
	}
	log := logger(cfg.Logger, t)

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
	if err := tx.QueryRow(ctx, render(parkSQL, t), cfg.ID, cfg.Reason).Scan(&ev.ParkedAt, &lastErr); err != nil {
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
func Unpark(ctx context.Context, db Beginner, cfg UnparkConfig) (UnparkResult, error) {
	res := UnparkResult{Applied: cfg.Apply}
	if err := cfg.Tables.Validate(); err != nil {
		return res, err
	}
	t := cfg.Tables.WithDefaults()
	if cfg.ID <= 0 {
		return res, fmt.Errorf("ops: event id %d: ids are positive", cfg.ID)
	}
	log := logger(cfg.Logger, t)

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
	if _, err := tx.Exec(ctx, render(unparkSQL, t), cfg.ID); err != nil {
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

// DefaultReplayChunk is how many ids of the primary key Replay looks at
// per transaction.
const DefaultReplayChunk = 10_000

// ReplayConfig says which dispatched events Replay sets back to pending.
type ReplayConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// FromID and ToID bound the range of ids, both included. Required.
	FromID, ToID int64
	// Type, when set, replays only events of this type.
	Type string
	// AggregateID, when set, replays only events of this aggregate.
	AggregateID uuid.UUID
	// ChunkSize is how many rows of the primary key one transaction looks
	// at. Defaults to DefaultReplayChunk (10,000).
	ChunkSize int
	// Apply replays them; otherwise Replay only counts them. Defaults to
	// false: a dry run.
	Apply bool
	// Logger receives the Info line of an applied run. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// ReplayResult is what Replay did, or would do.
type ReplayResult struct {
	// Applied is false for a dry run.
	Applied bool
	// Rows counts the rows replayed (or that would be); FirstID and LastID
	// are the lowest and highest of their ids, 0 when none.
	Rows, FirstID, LastID int64
	// Pending counts rows of the range matching the filters that were
	// pending already: they are left as they are.
	Pending int64
	// Chunks is the number of transactions an applied run committed.
	Chunks int
	// OldestID is the lowest id left in the outbox (0 when it is empty):
	// dispatched rows below it were deleted by retention cleanup and cannot
	// be replayed.
	OldestID int64
}

// Replay sets dispatched events with ids in [FromID, ToID] (and the Type
// and AggregateID, when set) back to pending, so that the relayers publish
// them again, e.g. for a new consumer; consumers deduplicate by event_id.
// It works in windows of ChunkSize rows of the primary key, each its own
// transaction that NOTIFYs the relayers, never in one large update. Each
// replayed row's requeued_at becomes now(), and its created_at stays: the
// lag, the stuck-row watchdog and the commit-to-publish latency measure
// how long it has waited for the replay, not its age; a failure record
// left from its earlier life is deleted.
//
// Rows deleted by retention cleanup cannot be replayed (OldestID says
// where the outbox starts). Events of one aggregate are replayed in id
// order, but an event emitted while a replay runs can reach the broker
// between two chunks' replayed events of its aggregate.
//
// When ctx is cancelled between chunks, Replay returns what it did so far
// and ctx's error; every finished chunk stays committed.
func Replay(ctx context.Context, db Beginner, cfg ReplayConfig) (ReplayResult, error) {
	res := ReplayResult{Applied: cfg.Apply}
	if err := cfg.Tables.Validate(); err != nil {
		return res, err
	}
	t := cfg.Tables.WithDefaults()
	switch {
	case cfg.FromID <= 0 || cfg.ToID <= 0:
		return res, fmt.Errorf("ops: replay needs a range of ids, from %d to %d: both ends are positive ids, and both are included", cfg.FromID, cfg.ToID)
	case cfg.FromID > cfg.ToID:
		return res, fmt.Errorf("ops: replay range from %d to %d is inverted: the first id must not be above the last", cfg.FromID, cfg.ToID)
	case cfg.ChunkSize < 0 || cfg.ChunkSize > 1_000_000:
		return res, fmt.Errorf("ops: replay ChunkSize is %d; use 1 to 1000000, or 0 for the default %d", cfg.ChunkSize, DefaultReplayChunk)
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = DefaultReplayChunk
	}
	var typ, agg any // NULL: any
	if cfg.Type != "" {
		typ = cfg.Type
	}
	if cfg.AggregateID != uuid.Nil {
		agg = cfg.AggregateID
	}
	log := logger(cfg.Logger, t)

	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, render(oldestIDSQL, t)).Scan(&res.OldestID); err != nil {
			return err
		}
		if cfg.Apply {
			return nil
		}
		return tx.QueryRow(ctx, render(replayCountSQL, t), cfg.FromID, cfg.ToID, typ, agg).Scan(&res.Rows, &res.Pending, &res.FirstID, &res.LastID)
	}); err != nil {
		return res, fmt.Errorf("ops: replay: count rows %d to %d of %s: %w", cfg.FromID, cfg.ToID, t.OutboxIdent(), err)
	}
	if !cfg.Apply {
		return res, nil
	}

	q := render(replaySQL, t)
	from := cfg.FromID
	for {
		ch, err := replayChunk(ctx, db, t, q, from, cfg, typ, agg)
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			logReplay(log, cfg, res)
			return res, replayStopped(cfg, res, from, err)
		}
		res.Chunks++
		res.Rows += ch.replayed
		res.Pending += ch.pending
		if ch.replayed > 0 {
			if res.FirstID == 0 {
				res.FirstID = ch.first
			}
			res.LastID = ch.last
		}
		if ch.scanned < int64(cfg.ChunkSize) || ch.lastSeen >= cfg.ToID {
			break
		}
		from = ch.lastSeen + 1
		if ctx.Err() != nil {
			logReplay(log, cfg, res)
			return res, replayStopped(cfg, res, from, ctx.Err())
		}
	}
	logReplay(log, cfg, res)
	return res, nil
}

// replayedChunk is what one chunk of Replay did.
type replayedChunk struct {
	replayed, first, last, pending, scanned, lastSeen int64
}

// replayChunk replays the matching dispatched rows among the next
// cfg.ChunkSize ids from from, in a transaction of its own that NOTIFYs
// the relayers when it replayed any.
func replayChunk(ctx context.Context, db Beginner, t outbox.Tables, q string, from int64, cfg ReplayConfig, typ, agg any) (replayedChunk, error) {
	var ch replayedChunk
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, q, from, cfg.ToID, cfg.ChunkSize, typ, agg).Scan(&ch.replayed, &ch.first, &ch.last, &ch.pending, &ch.scanned, &ch.lastSeen); err != nil {
			return err
		}
		if ch.replayed > 0 {
			if _, err := tx.Exec(ctx, notifySQL, t.Channel()); err != nil {
				return fmt.Errorf("notify the relayers: %w", err)
			}
		}
		return nil
	})
	return ch, err
}

// replayStopped is the error of a Replay that stopped at id from: what
// stays replayed and how to finish.
func replayStopped(cfg ReplayConfig, res ReplayResult, from int64, err error) error {
	return fmt.Errorf("ops: replay stopped at id %d of %d to %d after %d rows in %d chunks (those stay replayed; "+
		"to finish, replay from id %d): %w", from, cfg.FromID, cfg.ToID, res.Rows, res.Chunks, from, err)
}

func logReplay(log *slog.Logger, cfg ReplayConfig, res ReplayResult) {
	if res.Rows == 0 {
		return // nothing changed
	}
	args := []any{"verb", "replay", "from_id", cfg.FromID, "to_id", cfg.ToID, "replayed", res.Rows,
		"first_id", res.FirstID, "last_id", res.LastID, "chunks", res.Chunks}
	if cfg.Type != "" {
		args = append(args, "type", cfg.Type)
	}
	if cfg.AggregateID != uuid.Nil {
		args = append(args, "aggregate_id", cfg.AggregateID)
	}
	log.Info("replayed dispatched outbox events: set back to pending for the relayers to publish again", args...)
}

// notifyAndCommit wakes the relayers when tx commits, and commits it.
func notifyAndCommit(ctx context.Context, tx pgx.Tx, t outbox.Tables) error {
	if _, err := tx.Exec(ctx, notifySQL, t.Channel()); err != nil {
		return fmt.Errorf("notify the relayers: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func logger(l *slog.Logger, t outbox.Tables) *slog.Logger {
	if l == nil {
		l = slog.Default()
	}
	return l.With("outbox", t.OutboxIdent())
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }
