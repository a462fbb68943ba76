package consumer

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"
)

// fault says whose fault a failed attempt to process a record was, which
// decides how the record is retried.
type fault int

const (
	// notTheEvent: the database is unreachable or shutting down, the
	// transaction lost a deadlock or serialisation conflict, or the
	// database refuses every event alike (a missing table, a revoked
	// grant). Nothing is wrong with the record: it waits and is retried
	// without limit, without using up an attempt. Dead-lettering here
	// would empty the topic into its dead-letter topic during an outage.
	notTheEvent fault = iota
	// theHandler: the handler failed, or its writes were refused when the
	// transaction committed (a deferred constraint). The record is retried
	// up to MaxAttempts (once when the error is Permanent), then
	// dead-lettered.
	theHandler
	// theRecord: the processed table refuses the record's own data (its
	// source cannot be stored or indexed). A retry fails the same way, so
	// it is dead-lettered at once.
	theRecord
)

// classify says whose fault err, returned by Process or ProcessBatch, is.
// A handler error is checked for a database outage by the caller (a
// handler's query fails when the database is down, and the handler is not
// to blame); classify only reads the error.
func classify(err error) fault {
	if conflict(err) {
		return notTheEvent
	}
	var he *HandlerError
	if errors.As(err, &he) {
		return theHandler
	}
	if errors.Is(err, ErrInvalidEvent) {
		return theRecord
	}
	if dataError(err) {
		// Not the dedupe insert (its data errors are ErrInvalidEvent), so
		// the commit: a deferred constraint or trigger refused what the
		// handler wrote.
		return theHandler
	}
	return notTheEvent
}

// conflict reports a deadlock or serialisation failure: transient, caused
// by concurrent transactions (handlers of other partitions updating the
// same rows in another order), gone on a retry.
func conflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// dataError reports an error the server raised because of the values a
// statement carried, which the same values raise again on every retry:
// SQLSTATE class 22 (data exception: an invalid byte sequence, an
// untranslatable character, a string too long, a number out of range),
// class 23 (integrity constraint violation) and 54000 (a value too large
// to index). Connection errors, shutdowns (57P01), conflicts (40001,
// 40P01) and the like are not: they come from the server's state.
func dataError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23":
		return true
	}
	return pgErr.Code == "54000"
}

// recordError is the error of a dedupe insert that failed. When the server
// refused the event's data, it wraps ErrInvalidEvent: a retry cannot help.
func recordError(err error, what, table string) error {
	if dataError(err) {
		return fmt.Errorf("%w: %s cannot record %s: %w", ErrInvalidEvent, table, what, err)
	}
	return fmt.Errorf("consumer: record %s in %s: %w", what, table, err)
}

// refused reports a dead-letter write the broker (or the client, before
// sending) refused for good because of the record itself: too large for
// the topic or the client, or a record the broker calls invalid. A retry
// of the same record fails the same way; a smaller record may not.
func refused(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) ||
		errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord)
}
