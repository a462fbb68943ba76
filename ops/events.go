package ops

// The operator's verbs on single events: show, retry, park, unpark and
// replay (`outbox events ...`). Each mutating verb is a dry run unless its
// config says Apply: the dry run reads what would change and changes
// nothing; the applied run changes it in a transaction, NOTIFYs the
// relayers on the outbox's channel in that same transaction (so they wake
// when the change is visible) and logs one Info line naming the ids.
// One file per verb (show.go, retry.go, park.go, unpark.go, replay.go);
// this one holds what they share.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/migrate"
)

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

func notFound(t outbox.Tables, id int64) error {
	return eventErr(ErrEventNotFound, "event %d is neither in %s nor parked in %s: no such id was written, "+
		"or retention cleanup deleted it after it was dispatched (dispatched rows are kept for the cleanup's retention, 7 days by default)",
		id, t.OutboxIdent(), migrate.ParkedIdent(t))
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

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }
