package ops_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/ops"
)

// evdb is a migrated test outbox with SQL helpers for the verbs' tests.
type evdb struct {
	*pgtest.DB
	t *testing.T
}

func newEvDB(t *testing.T) *evdb {
	t.Helper()
	return &evdb{DB: pgtest.New(t, pgtest.Options{MaxConns: 4}), t: t}
}

func (d *evdb) exec(sql string, args ...any) int64 {
	d.t.Helper()
	tag, err := d.Pool.Exec(context.Background(), d.render(sql), args...)
	require.NoError(d.t, err, sql)
	return tag.RowsAffected()
}

func (d *evdb) render(sql string) string {
	return strings.NewReplacer("{{outbox}}", d.Tables.OutboxIdent(), "{{failures}}", migrate.FailuresIdent(d.Tables),
		"{{parked}}", migrate.ParkedIdent(d.Tables)).Replace(sql)
}

// row inserts one outbox row by plain SQL and returns its id.
func (d *evdb) row(agg uuid.UUID, typ, payload string, dispatched bool) int64 {
	d.t.Helper()
	var id int64
	require.NoError(d.t, d.Pool.QueryRow(context.Background(), d.render(`INSERT INTO {{outbox}} (aggregate_id, type, payload, dispatched_at)
VALUES ($1, $2, $3::jsonb, CASE WHEN $4 THEN now() END) RETURNING id`), agg, typ, payload, dispatched).Scan(&id))
	return id
}

// hold records a failure for id, held for the given interval from now
// (negative: a hold that has expired; "" for no hold).
func (d *evdb) hold(id int64, reason, errText string, attempts int, heldFor string) {
	d.t.Helper()
	var until any
	if heldFor != "" {
		until = heldFor
	}
	d.exec(`INSERT INTO {{failures}} (event_id, aggregate_id, type, reason, error, attempts, first_failed_at, failed_at, held_until)
SELECT id, aggregate_id, type, $2, $3, $4, now() - interval '10 minutes', now() - interval '1 minute', now() + $5::interval
FROM {{outbox}} WHERE id = $1`, id, reason, errText, attempts, until)
}

// tables dumps the outbox, failures and parked tables as text: equal
// dumps mean nothing changed.
func (d *evdb) tables() string {
	d.t.Helper()
	var out []string
	for _, q := range []string{
		`SELECT coalesce(string_agg(format('%s|%s|%s|%s|%s|%s|%s', id, aggregate_id, type, payload::text, headers::text, created_at, dispatched_at), E'\n' ORDER BY id), '') FROM {{outbox}}`,
		`SELECT coalesce(string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s', event_id, aggregate_id, type, reason, error, attempts, failed_at, held_until), E'\n' ORDER BY event_id), '') FROM {{failures}}`,
		`SELECT coalesce(string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s', id, aggregate_id, type, payload::text, headers::text, created_at, reason, last_error), E'\n' ORDER BY id), '') FROM {{parked}}`,
	} {
		var s string
		require.NoError(d.t, d.Pool.QueryRow(context.Background(), d.render(q)).Scan(&s))
		out = append(out, s)
	}
	return strings.Join(out, "\n--\n")
}

func (d *evdb) count(sql string, args ...any) int64 {
	d.t.Helper()
	var n int64
	require.NoError(d.t, d.Pool.QueryRow(context.Background(), d.render(sql), args...).Scan(&n))
	return n
}

// listen returns a function that reports whether a NOTIFY arrived on the
// outbox's channel within a second.
func (d *evdb) listen() func() bool {
	d.t.Helper()
	conn, err := d.Pool.Acquire(context.Background())
	require.NoError(d.t, err)
	d.t.Cleanup(conn.Release)
	_, err = conn.Exec(context.Background(), "LISTEN "+pgident.Quote(d.Tables.Channel()))
	require.NoError(d.t, err)
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := conn.Conn().WaitForNotification(ctx)
		return err == nil
	}
}

// logBuffer is a JSON slog logger and the lines it wrote.
func logBuffer() (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	return slog.New(slog.NewJSONHandler(&buf, nil)), &buf
}

func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		out = append(out, m)
	}
	return out
}

func TestShowEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newEvDB(t)
	agg := uuid.New()
	done := d.row(agg, "order.placed", `{"n": 0}`, true)
	head := d.row(agg, "order.placed", `{"n": 1}`, false)
	// A payload of 602 bytes with a 2-byte character across byte 500.
	long := `{"s": "` + strings.Repeat("a", 492) + "é" + strings.Repeat("b", 99) + `"}`
	behind := d.row(agg, "order.paid", long, false)
	d.exec(`UPDATE {{outbox}} SET headers = '{"trace": "t-1"}' WHERE id = $1`, behind)
	d.hold(head, "too_large", "MESSAGE_TOO_LARGE: the record is too large", 3, "1 hour")

	show := func(id int64, preview int) (ops.EventDetail, error) {
		return ops.ShowEvent(ctx, d.Pool, ops.ShowConfig{Tables: d.Tables, ID: id, PreviewBytes: preview})
	}

	e, err := show(head, 0)
	require.NoError(t, err)
	require.Equal(t, ops.EventPending, e.State)
	require.Equal(t, agg, e.AggregateID)
	require.Equal(t, "order.placed", e.Type)
	require.True(t, e.DispatchedAt.IsZero())
	require.Equal(t, `{"n": 1}`, e.Payload)
	require.Equal(t, len(`{"n": 1}`), e.PayloadBytes)
	require.False(t, e.PayloadTruncated)
	require.Nil(t, e.Headers)
	require.Equal(t, outbox.KafkaRouting{}.RecordSize(head, "order.placed", e.PayloadBytes, nil, ""), e.RecordBytes)
	require.Zero(t, e.BlockedBy, "the aggregate's oldest pending row waits for nothing")
	require.NotNil(t, e.Failure)
	require.Equal(t, "too_large", e.Failure.Reason)
	require.Equal(t, "MESSAGE_TOO_LARGE: the record is too large", e.Failure.Error)
	require.Equal(t, 3, e.Failure.Attempts)
	require.True(t, e.Failure.HoldActive)
	require.WithinDuration(t, time.Now().Add(time.Hour), e.Failure.HeldUntil, time.Minute)
	require.True(t, e.Failure.FirstFailedAt.Before(e.Failure.FailedAt))

	e, err = show(behind, 0)
	require.NoError(t, err)
	require.Equal(t, head, e.BlockedBy)
	require.Nil(t, e.Failure)
	require.Equal(t, 602, e.PayloadBytes)
	require.True(t, e.PayloadTruncated)
	require.Len(t, e.Payload, 499, "the preview stops before a character it would split")
	require.True(t, strings.HasPrefix(long, e.Payload))
	require.JSONEq(t, `{"trace": "t-1"}`, string(e.Headers))
	require.Equal(t, outbox.KafkaRouting{}.RecordSize(behind, "order.paid", 602, map[string]string{"trace": "t-1"}, ""), e.RecordBytes)

	e, err = show(behind, -1)
	require.NoError(t, err)
	require.Equal(t, long, e.Payload)
	require.False(t, e.PayloadTruncated)

	e, err = show(done, 0)
	require.NoError(t, err)
	require.Equal(t, ops.EventDispatched, e.State)
	require.False(t, e.DispatchedAt.IsZero())
	require.Zero(t, e.BlockedBy)

	// An expired hold is shown, not active.
	d.exec(`UPDATE {{failures}} SET held_until = now() - interval '1 second'`)
	e, err = show(head, 0)
	require.NoError(t, err)
	require.False(t, e.Failure.HoldActive)
	require.False(t, e.Failure.HeldUntil.IsZero())

	// Headers that are not an object of strings (a hand-written row) are
	// shown as they are, without a record size.
	d.exec(`UPDATE {{outbox}} SET headers = '{"n": 1}' WHERE id = $1`, head)
	e, err = show(head, 0)
	require.NoError(t, err)
	require.JSONEq(t, `{"n": 1}`, string(e.Headers))
	require.Zero(t, e.RecordBytes)

	_, err = ops.Park(ctx, d.Pool, ops.ParkConfig{Tables: d.Tables, ID: head, Reason: "poison", Apply: true, Logger: opstest.Logger(t)})
	require.NoError(t, err)
	e, err = show(head, 0)
	require.NoError(t, err)
	require.Equal(t, ops.EventParked, e.State)
	require.NotNil(t, e.Parked)
	require.Equal(t, "poison", e.Parked.Reason)
	require.Equal(t, "MESSAGE_TOO_LARGE: the record is too large", e.Parked.LastError)
	require.Nil(t, e.Failure)
	require.Equal(t, `{"n": 1}`, e.Payload)

	_, err = show(behind+1000, 0)
	require.ErrorIs(t, err, ops.ErrEventNotFound)
	require.ErrorContains(t, err, "retention cleanup")
	_, err = show(0, 0)
	require.ErrorContains(t, err, "ids are positive")
}

func TestRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newEvDB(t)
	log, logs := logBuffer()
	agg, other := uuid.New(), uuid.New()
	head := d.row(agg, "order.placed", `{}`, false)
	behind := d.row(agg, "order.paid", `{}`, false)
	held2 := d.row(other, "order.placed", `{}`, false)
	expired := d.row(uuid.New(), "order.placed", `{}`, false)
	done := d.row(uuid.New(), "order.placed", `{}`, true)
	d.hold(head, "too_large", "too large", 2, "1 hour")
	d.hold(held2, "invalid_topic", "bad topic", 1, "1 hour")
	d.hold(expired, "broker_refused", "nope", 4, "-1 minute")
	notified := d.listen()

	retry := func(cfg ops.RetryConfig) (ops.RetryResult, error) {
		cfg.Tables, cfg.Logger = d.Tables, log
		return ops.Retry(ctx, d.Pool, cfg)
	}

	// Dry run: reports the hold, changes nothing.
	before := d.tables()
	res, err := retry(ops.RetryConfig{EventID: head})
	require.NoError(t, err)
	require.False(t, res.Applied)
	require.Len(t, res.Holds, 1)
	h := res.Holds[0]
	require.Equal(t, head, h.EventID)
	require.Equal(t, agg, h.AggregateID)
	require.Equal(t, "too_large", h.Reason)
	require.Equal(t, 2, h.Attempts)
	require.WithinDuration(t, time.Now().Add(time.Hour), h.Until, time.Minute)
	require.Equal(t, before, d.tables())
	require.False(t, notified(), "a dry run notifies nobody")
	require.Empty(t, logs.String())

	// A row behind a held row is not held itself: nothing to do, and the
	// result names the row and hold it waits behind.
	res, err = retry(ops.RetryConfig{EventID: behind, Apply: true})
	require.NoError(t, err)
	require.Empty(t, res.Holds)
	require.Equal(t, head, res.BlockedBy)
	require.NotNil(t, res.BlockedByHold)
	require.Equal(t, head, res.BlockedByHold.EventID)
	require.Equal(t, before, d.tables())

	// An expired hold is no hold.
	res, err = retry(ops.RetryConfig{EventID: expired, Apply: true})
	require.NoError(t, err)
	require.Empty(t, res.Holds)
	require.Zero(t, res.BlockedBy)
	require.Equal(t, before, d.tables())
	require.Empty(t, logs.String())

	// Applied: exactly that hold is lifted, its history kept, relayers woken.
	res, err = retry(ops.RetryConfig{EventID: head, Apply: true})
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.Len(t, res.Holds, 1)
	require.Equal(t, head, res.Holds[0].EventID)
	require.True(t, notified())
	require.Equal(t, int64(1), d.count(`SELECT count(*) FROM {{failures}} WHERE event_id = $1 AND held_until IS NULL AND attempts = 2 AND reason = 'too_large' AND error = 'too large'`, head))
	require.Equal(t, int64(1), d.count(`SELECT count(*) FROM {{failures}} WHERE event_id = $1 AND held_until > now()`, held2))
	require.Equal(t, int64(3), d.count(`SELECT count(*) FROM {{failures}}`))
	require.NotEqual(t, before, d.tables())
	lines := logLines(t, logs)
	require.Len(t, lines, 1)
	require.Equal(t, "INFO", lines[0]["level"])
	require.Equal(t, "retry", lines[0]["verb"])
	require.Equal(t, []any{float64(head)}, lines[0]["event_ids"])
	logs.Reset()

	// Lifted already: nothing to do.
	res, err = retry(ops.RetryConfig{EventID: head, Apply: true})
	require.NoError(t, err)
	require.Empty(t, res.Holds)

	// By aggregate: every active hold of the aggregate's pending rows.
	d.exec(`UPDATE {{failures}} SET held_until = now() + interval '1 hour' WHERE event_id = $1`, head)
	d.exec(`INSERT INTO {{failures}} (event_id, aggregate_id, type, reason, error, first_failed_at, failed_at, held_until)
VALUES ($1, $2, 'order.placed', 'too_large', 'x', now(), now(), now() + interval '1 hour')`, done, agg) // dispatched: holds nothing
	res, err = retry(ops.RetryConfig{AggregateID: agg})
	require.NoError(t, err)
	require.Len(t, res.Holds, 1)
	require.Equal(t, head, res.Holds[0].EventID)
	res, err = retry(ops.RetryConfig{AggregateID: agg, Apply: true})
	require.NoError(t, err)
	require.Len(t, res.Holds, 1)
	require.True(t, notified())
	require.Equal(t, int64(1), d.count(`SELECT count(*) FROM {{failures}} WHERE event_id = $1 AND held_until > now()`, done), "the dispatched row's record is left alone")
	require.Equal(t, int64(1), d.count(`SELECT count(*) FROM {{failures}} WHERE event_id = $1 AND held_until IS NULL`, head))
	lines = logLines(t, logs)
	require.Len(t, lines, 1)
	require.Equal(t, agg.String(), lines[0]["aggregate_id"])
	res, err = retry(ops.RetryConfig{AggregateID: uuid.New(), Apply: true})
	require.NoError(t, err)
	require.Empty(t, res.Holds)

	// Errors.
	_, err = retry(ops.RetryConfig{EventID: done})
	require.ErrorIs(t, err, ops.ErrEventDispatched)
	require.ErrorContains(t, err, "outbox events replay")
	_, err = retry(ops.RetryConfig{EventID: done + 1000})
	require.ErrorIs(t, err, ops.ErrEventNotFound)
	_, err = retry(ops.RetryConfig{})
	require.ErrorContains(t, err, "either an event id or an aggregate id")
	_, err = retry(ops.RetryConfig{EventID: head, AggregateID: agg})
	require.ErrorContains(t, err, "not both")
	_, err = ops.Park(ctx, d.Pool, ops.ParkConfig{Tables: d.Tables, ID: held2, Reason: "r", Apply: true, Logger: opstest.Logger(t)})
	require.NoError(t, err)
	_, err = retry(ops.RetryConfig{EventID: held2})
	require.ErrorIs(t, err, ops.ErrEventParked)
	require.ErrorContains(t, err, "outbox events unpark")
}

// rowText is an outbox row's every column as text, dispatched_at and
// requeued_at aside.
func (d *evdb) rowText(table string, id int64) string {
	d.t.Helper()
	var s string
	require.NoError(d.t, d.Pool.QueryRow(context.Background(), d.render(`SELECT format('%s|%s|%s|%s|%s|%s', id, aggregate_id, type, payload::text, headers::text, created_at) FROM `+table+` WHERE id = $1`), id).Scan(&s))
	return s
}

func TestParkAndUnpark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newEvDB(t)
	log, logs := logBuffer()
	agg := uuid.New()
	before1 := d.row(agg, "order.placed", `{}`, true)
	// Byte-exact round trip: unicode, numbers, nesting, headers, an old
	// created_at with microseconds.
	big := d.row(agg, "order.placed", `{"b": [1, 2.50, {"x": "ü\n\u00e9"}], "a": "\"quoted\""}`, false)
	d.exec(`UPDATE {{outbox}} SET headers = '{"trace": "t-9", "tenant": "ä"}', created_at = '2026-01-02 03:04:05.123456+00' WHERE id = $1`, big)
	later := []int64{d.row(agg, "order.paid", `{}`, false), d.row(agg, "order.shipped", `{}`, false)}
	d.row(uuid.New(), "order.placed", `{}`, false)
	d.hold(big, "too_large", "MESSAGE_TOO_LARGE", 5, "1 hour")
	original := d.rowText("{{outbox}}", big)
	notified := d.listen()

	park := func(id int64, apply bool) (ops.ParkResult, error) {
		return ops.Park(ctx, d.Pool, ops.ParkConfig{Tables: d.Tables, ID: id, Reason: "too big for the broker; ticket OPS-1", Apply: apply, Logger: log})
	}
	unpark := func(id int64, apply bool) (ops.UnparkResult, error) {
		return ops.Unpark(ctx, d.Pool, ops.UnparkConfig{Tables: d.Tables, ID: id, Apply: apply, Logger: log})
	}

	// Dry run.
	before := d.tables()
	res, err := park(big, false)
	require.NoError(t, err)
	require.False(t, res.Applied)
	require.Equal(t, big, res.Event.ID)
	require.Equal(t, agg, res.Event.AggregateID)
	require.Equal(t, "MESSAGE_TOO_LARGE", res.Event.LastError)
	require.True(t, res.Event.ParkedAt.IsZero())
	require.Equal(t, int64(2), res.LaterPending)
	require.Equal(t, before, d.tables())
	require.False(t, notified())

	// Applied: out of the outbox, into parked, its failure record gone.
	res, err = park(big, true)
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.Equal(t, int64(2), res.LaterPending)
	require.False(t, res.Event.ParkedAt.IsZero())
	require.True(t, notified())
	require.Zero(t, d.count(`SELECT count(*) FROM {{outbox}} WHERE id = $1`, big))
	require.Zero(t, d.count(`SELECT count(*) FROM {{failures}}`))
	require.Equal(t, original, d.rowText("{{parked}}", big))
	require.Equal(t, int64(1), d.count(`SELECT count(*) FROM {{parked}} WHERE id = $1 AND reason = 'too big for the broker; ticket OPS-1' AND last_error = 'MESSAGE_TOO_LARGE' AND parked_at > now() - interval '1 minute'`, big))
	require.Equal(t, int64(4), d.count(`SELECT count(*) FROM {{outbox}}`), "nothing else moved")
	lines := logLines(t, logs)
	require.Len(t, lines, 1)
	require.Equal(t, "park", lines[0]["verb"])
	require.Equal(t, float64(big), lines[0]["event_id"])
	logs.Reset()

	// Errors of park.
	_, err = park(big, true)
	require.ErrorIs(t, err, ops.ErrEventParked)
	require.ErrorContains(t, err, "already parked")
	_, err = park(before1, true)
	require.ErrorIs(t, err, ops.ErrEventDispatched)
	_, err = park(before1, false)
	require.ErrorIs(t, err, ops.ErrEventDispatched, "the dry run checks as much")
	_, err = park(big+1000, true)
	require.ErrorIs(t, err, ops.ErrEventNotFound)
	_, err = ops.Park(ctx, d.Pool, ops.ParkConfig{Tables: d.Tables, ID: later[0], Reason: "  ", Apply: true})
	require.ErrorContains(t, err, "park needs a reason")

	// Unpark: dry run, then applied; the row is back byte for byte,
	// pending, under its id.
	parkedState := d.tables()
	ures, err := unpark(big, false)
	require.NoError(t, err)
	require.False(t, ures.Applied)
	require.Equal(t, "too big for the broker; ticket OPS-1", ures.Event.Reason)
	require.Equal(t, int64(2), ures.LaterPending)
	require.Equal(t, parkedState, d.tables())
	require.False(t, notified())

	ures, err = unpark(big, true)
	require.NoError(t, err)
	require.True(t, ures.Applied)
	require.True(t, notified())
	require.Equal(t, original, d.rowText("{{outbox}}", big))
	require.Equal(t, int64(1), d.count(`SELECT count(*) FROM {{outbox}} WHERE id = $1 AND requeued_at > now() - interval '1 minute'`, big),
		"an unparked row waits from its unpark: requeued_at")
	require.Equal(t, int64(1), d.count(`SELECT count(*) FROM {{outbox}} WHERE id = $1 AND dispatched_at IS NULL`, big))
	require.Zero(t, d.count(`SELECT count(*) FROM {{parked}}`))
	lines = logLines(t, logs)
	require.Len(t, lines, 1)
	require.Equal(t, "unpark", lines[0]["verb"])
	require.Equal(t, float64(big), lines[0]["event_id"])
	e, err := ops.ShowEvent(ctx, d.Pool, ops.ShowConfig{Tables: d.Tables, ID: later[0]})
	require.NoError(t, err)
	require.Equal(t, big, e.BlockedBy, "back in front of its aggregate")

	// Errors of unpark.
	_, err = unpark(big, true)
	require.ErrorIs(t, err, ops.ErrEventNotParked)
	require.ErrorContains(t, err, "it is in the outbox, pending")
	_, err = unpark(big+1000, false)
	require.ErrorIs(t, err, ops.ErrEventNotFound)
}

// A row another transaction holds (a relayer publishing it) is not
// parked: Park waits LockTimeout, then says so; the row stays.
func TestParkLockedRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newEvDB(t)
	id := d.row(uuid.New(), "order.placed", `{}`, false)
	tx, err := d.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, d.render(`SELECT 1 FROM {{outbox}} WHERE id = $1 FOR UPDATE`), id)
	require.NoError(t, err)

	start := time.Now()
	_, err = ops.Park(ctx, d.Pool, ops.ParkConfig{Tables: d.Tables, ID: id, Reason: "r", LockTimeout: 300 * time.Millisecond, Apply: true})
	require.ErrorIs(t, err, ops.ErrEventLocked)
	require.ErrorContains(t, err, "try again")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, int64(1), d.count(`SELECT count(*) FROM {{outbox}} WHERE id = $1`, id))
	require.Zero(t, d.count(`SELECT count(*) FROM {{parked}}`))

	// The lock is free now: it parks.
	_, err = ops.Park(ctx, d.Pool, ops.ParkConfig{Tables: d.Tables, ID: id, Reason: "r", LockTimeout: 300 * time.Millisecond, Apply: true, Logger: opstest.Logger(t)})
	require.NoError(t, err)
}

func TestReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newEvDB(t)
	log, logs := logBuffer()
	agg := uuid.New()
	// 25,000 dispatched rows, old; every 1,000th is still pending; every
	// 10th is a payment on aggregate agg.
	d.exec(`INSERT INTO {{outbox}} (aggregate_id, type, payload, created_at, dispatched_at)
SELECT CASE WHEN i % 10 = 0 THEN $1 ELSE gen_random_uuid() END,
  CASE WHEN i % 10 = 0 THEN 'payment.captured' ELSE 'order.placed' END,
  jsonb_build_object('i', i), now() - interval '2 days',
  CASE WHEN i % 1000 = 0 THEN NULL ELSE now() - interval '2 days' END
FROM generate_series(1, 25000) i ORDER BY i`, agg)
	var first, last int64
	require.NoError(t, d.Pool.QueryRow(ctx, d.render(`SELECT min(id), max(id) FROM {{outbox}}`)).Scan(&first, &last))
	notified := d.listen()

	replay := func(cfg ops.ReplayConfig) (ops.ReplayResult, error) {
		cfg.Tables, cfg.Logger = d.Tables, log
		return ops.Replay(ctx, d.Pool, cfg)
	}

	// Dry run: the count over the range, nothing changed.
	before := d.tables()
	res, err := replay(ops.ReplayConfig{FromID: first, ToID: last})
	require.NoError(t, err)
	require.False(t, res.Applied)
	require.Equal(t, int64(24975), res.Rows)
	require.Equal(t, int64(25), res.Pending)
	require.Equal(t, first, res.FirstID)
	require.Equal(t, last-1, res.LastID, "the last row is pending")
	require.Equal(t, first, res.OldestID)
	require.Equal(t, before, d.tables())
	require.False(t, notified())
	require.Empty(t, logs.String())

	res, err = replay(ops.ReplayConfig{FromID: first, ToID: first + 99, Type: "payment.captured", AggregateID: agg})
	require.NoError(t, err)
	require.Equal(t, int64(10), res.Rows)

	// Applied with a filter, on part of the range: only those rows.
	res, err = replay(ops.ReplayConfig{FromID: first, ToID: first + 99, Type: "payment.captured", Apply: true})
	require.NoError(t, err)
	require.Equal(t, int64(10), res.Rows)
	require.Equal(t, 1, res.Chunks)
	require.True(t, notified())
	require.Equal(t, int64(35), d.count(`SELECT count(*) FROM {{outbox}} WHERE dispatched_at IS NULL`))
	require.Equal(t, int64(10), d.count(`SELECT count(*) FROM {{outbox}} WHERE dispatched_at IS NULL AND type = 'payment.captured' AND id <= $1 AND requeued_at > now() - interval '1 minute' AND created_at < now() - interval '1 day'`, first+99))
	logs.Reset()
	d.exec(`UPDATE {{outbox}} SET dispatched_at = now() - interval '2 days', requeued_at = NULL WHERE id <= $1`, first+99)

	// A failure record of a replayed row's earlier life goes with it.
	d.exec(`INSERT INTO {{failures}} (event_id, aggregate_id, type, error, first_failed_at, failed_at, held_until)
SELECT id, aggregate_id, type, 'old', now() - interval '3 days', now() - interval '3 days', now() + interval '1 hour' FROM {{outbox}} WHERE id = $1`, first+1)

	// Applied over the whole range: three chunks of 10,000 ids, every
	// dispatched row pending again with requeued_at = now() and its
	// created_at kept, the pending rows untouched.
	res, err = replay(ops.ReplayConfig{FromID: first, ToID: last, Apply: true})
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.Equal(t, int64(24975), res.Rows)
	require.Equal(t, int64(25), res.Pending)
	require.Equal(t, 3, res.Chunks)
	require.Equal(t, first, res.FirstID)
	require.Equal(t, last-1, res.LastID)
	require.Equal(t, int64(25000), d.count(`SELECT count(*) FROM {{outbox}} WHERE dispatched_at IS NULL`))
	require.Equal(t, int64(24975), d.count(`SELECT count(*) FROM {{outbox}} WHERE requeued_at > now() - interval '1 minute'`))
	require.Equal(t, int64(25), d.count(`SELECT count(*) FROM {{outbox}} WHERE requeued_at IS NULL`), "pending rows are left alone")
	require.Equal(t, int64(25000), d.count(`SELECT count(*) FROM {{outbox}} WHERE created_at < now() - interval '1 day'`), "created_at stays the event's own time")
	require.True(t, notified())
	require.Zero(t, d.count(`SELECT count(*) FROM {{failures}}`))
	lines := logLines(t, logs)
	require.Len(t, lines, 1, "one log line per verb")
	require.Equal(t, "replay", lines[0]["verb"])
	require.Equal(t, float64(first), lines[0]["from_id"])
	require.Equal(t, float64(24975), lines[0]["replayed"])

	// Rows deleted by retention are gone for good: the result says where
	// the outbox starts.
	d.exec(`DELETE FROM {{outbox}} WHERE id < $1`, first+500)
	res, err = replay(ops.ReplayConfig{FromID: first, ToID: first + 999})
	require.NoError(t, err)
	require.Equal(t, first+500, res.OldestID)
	require.Zero(t, res.Rows, "everything left is pending")
	require.Equal(t, int64(500), res.Pending)

	// Bad ranges.
	for _, tc := range []struct {
		cfg  ops.ReplayConfig
		want string
	}{
		{ops.ReplayConfig{ToID: 10}, "needs a range of ids"},
		{ops.ReplayConfig{FromID: 10}, "needs a range of ids"},
		{ops.ReplayConfig{FromID: 10, ToID: 9}, "is inverted"},
		{ops.ReplayConfig{FromID: 1, ToID: 9, ChunkSize: -1}, "ChunkSize"},
	} {
		_, err := replay(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

// Replay leaves a row a relayer is claiming right now (locked, marked
// dispatched in its open transaction) alone: to the replay it is pending.
func TestReplaySkipsRowsBeingClaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newEvDB(t)
	id := d.row(uuid.New(), "order.placed", `{}`, false)
	tx, err := d.Pool.BeginTx(ctx, pgx.TxOptions{})
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, d.render(`UPDATE {{outbox}} SET dispatched_at = now() WHERE id = $1`), id)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		res, err := ops.Replay(ctx, d.Pool, ops.ReplayConfig{Tables: d.Tables, FromID: id, ToID: id, Apply: true, Logger: opstest.Logger(t)})
		if err == nil && res.Rows != 0 {
			err = errors.New("replayed a row being claimed")
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("replay waited for the claiming transaction")
	}
	require.NoError(t, tx.Commit(ctx))
}
