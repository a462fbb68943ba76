package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Whose fault a failure is, by SQLSTATE and by where it was raised: the
// dedupe insert (recordError), a handler (*HandlerError), or neither (the
// commit). Only an unavailable database and conflicts are waited out
// without limit; the record's own data is dead-lettered at once, and a
// handler's data errors follow the handler retry policy.
func TestClassify(t *testing.T) {
	t.Parallel()
	data := []string{
		"22021", // invalid byte sequence for encoding
		"22P05", // untranslatable character
		"22001", // string too long
		"22003", // numeric value out of range
		"22P02", // invalid text representation
		"22007", // invalid datetime format
		"23502", // not null violation
		"23514", // check violation
		"23505", // unique violation
		"54000", // index row too large
	}
	unavailable := []string{
		"08000", "08003", "08006", "08001", // connection exceptions
		"57P01", "57P02", "57P03", // admin shutdown, crash shutdown, cannot connect now
		"53300", "53100", // too many connections, disk full
		"25006", // read-only transaction: a failover to a replica
		"42P01", // undefined table: refuses every event alike; an operator fixes it
		"42501", // insufficient privilege: likewise
	}
	conflicts := []string{"40001", "40P01"}
	pg := func(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code, Message: "x"} }
	handler := func(err error) error { return &HandlerError{EventID: 1, Err: fmt.Errorf("update balance: %w", err)} }

	for _, code := range data {
		require.True(t, dataError(pg(code)), code)
		require.Equal(t, theRecord, classify(recordError(pg(code), "event 1", "p")), "%s from the dedupe insert", code)
		require.ErrorIs(t, recordError(pg(code), "event 1", "p"), ErrInvalidEvent)
		require.Equal(t, theHandler, classify(handler(pg(code))), "%s from a handler", code)
		require.Equal(t, theHandler, classify(fmt.Errorf("consumer: commit event 1: %w", pg(code))), "%s from the commit", code)
	}
	for _, code := range unavailable {
		require.False(t, dataError(pg(code)), code)
		require.Equal(t, notTheEvent, classify(recordError(pg(code), "event 1", "p")), "%s from the dedupe insert", code)
		require.NotErrorIs(t, recordError(pg(code), "event 1", "p"), ErrInvalidEvent)
		require.Equal(t, notTheEvent, classify(fmt.Errorf("consumer: commit event 1: %w", pg(code))), "%s from the commit", code)
		// From a handler it counts an attempt unless the database then
		// fails a ping (processOne checks): the handler may have talked to
		// another service.
		require.Equal(t, theHandler, classify(handler(pg(code))), "%s from a handler", code)
	}
	for _, code := range conflicts {
		require.Equal(t, notTheEvent, classify(recordError(pg(code), "event 1", "p")), code)
		require.Equal(t, notTheEvent, classify(handler(pg(code))), code)
	}
	for _, err := range []error{
		&pgconn.ConnectError{Config: &pgconn.Config{}},
		io.ErrUnexpectedEOF,
		context.DeadlineExceeded,
		errors.New("conn closed"),
	} {
		require.Equal(t, notTheEvent, classify(recordError(err, "event 1", "p")), "%v", err)
	}
	// ErrInvalidEvent from a handler is the handler's error.
	require.Equal(t, theHandler, classify(handler(ErrInvalidEvent)))
}

func TestRefused(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		kerr.MessageTooLarge,
		kerr.RecordListTooLarge,
		kerr.InvalidRecord,
		// franz-go's own refusal before it sends, and its broker-side
		// message, both wrap the kerr error.
		fmt.Errorf("%w (uncompressed_bytes=2000000)", kerr.MessageTooLarge),
		fmt.Errorf("%w (uncompressed_bytes=100200, compressed_bytes=100200)", kerr.MessageTooLarge),
	} {
		require.True(t, refused(err), "%v", err)
	}
	for _, err := range []error{
		kerr.NotLeaderForPartition,
		kerr.TopicAuthorizationFailed,
		kerr.UnknownTopicOrPartition,
		kerr.RequestTimedOut,
		context.DeadlineExceeded,
		errors.New("dial tcp: connection refused"),
	} {
		require.False(t, refused(err), "%v", err)
	}
}
