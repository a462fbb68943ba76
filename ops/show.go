package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/migrate"
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
	// payload. Defaults to DefaultPreviewBytes (500).
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
	// text of its JSONB value, or a binary payload's bytes.
	PayloadBytes int
	// RecordBytes is the most bytes the event's Kafka record batch takes
	// when it travels alone (outbox.KafkaRouting.RecordSize, without an event_source
	// header): what the topic's max.message.bytes is compared with. Zero
	// when the headers are not a JSON object of strings (such a row cannot
	// be published).
	RecordBytes int
	// Payload is the payload's JSON text, whole or cut to PreviewBytes at a
	// character boundary (then PayloadTruncated is set); a binary
	// payload's bytes in hex ("\\x0a00ff"), whole or their first
	// PreviewBytes.
	Payload          string
	PayloadTruncated bool
	// ContentType is a binary payload's content type (an outbox with
	// binary payloads on); "" for a JSON payload.
	ContentType string
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
	// reserved_header, contract, not_authorized, broker_refused.
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
func ShowEvent(ctx context.Context, db outbox.DB, cfg ShowConfig) (EventDetail, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return EventDetail{}, err
	}
	return showEvent(ctx, db, cfg.Tables, cfg.ID, cfg.PreviewBytes)
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c ShowConfig) WithDefaults() ShowConfig {
	c.Tables = c.Tables.WithDefaults()
	if c.PreviewBytes == 0 {
		c.PreviewBytes = DefaultPreviewBytes
	}
	return c
}

// Validate reports a bad table name or an id that no event has.
func (c ShowConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	if c.ID <= 0 {
		return fmt.Errorf("ops: event id %d: ids are positive; take it from the event_id header or `outbox watchdog`", c.ID)
	}
	return nil
}

func showEvent(ctx context.Context, db outbox.DB, t outbox.Tables, id int64, preview int) (EventDetail, error) {
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
	binary, err := binaryTable(ctx, db, t)
	if err != nil {
		return d, err
	}
	show, showParked := render(showSQL, t), render(showParkedSQL, t)
	var contentType *string
	extra := []any{}
	if binary {
		show, showParked = render(showBinarySQL, t), render(showParkedBinarySQL, t)
		extra = append(extra, &contentType)
	}
	err = db.QueryRow(ctx, show, id, chars).Scan(append([]any{&d.ID, &d.AggregateID, &d.Type, &d.CreatedAt, &dispatched,
		&d.PayloadBytes, &d.Payload, &headers,
		&hasFailure, &reason, &errText, &attempts, &first, &failed, &heldUntil, &f.HoldActive, &blockedBy}, extra...)...)
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
		err = db.QueryRow(ctx, showParked, id, chars).Scan(append([]any{&d.ID, &d.AggregateID, &d.Type, &d.CreatedAt,
			&d.PayloadBytes, &d.Payload, &headers, &p.ParkedAt, &p.Reason, &lastErr}, extra...)...)
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
	d.finish(headers, contentType, preview)
	return d, nil
}

// finish sets what showEvent derives from the row it read: the headers,
// the payload cut to preview (or its hex, for a binary payload, which the
// query cut), and the record's size.
func (d *EventDetail) finish(headers, contentType *string, preview int) {
	if headers != nil {
		d.Headers = json.RawMessage(*headers)
	}
	sized := d.PayloadBytes
	if contentType != nil {
		// Hex of the bytes, already cut to preview bytes by the query.
		d.ContentType = *contentType
		d.PayloadTruncated = (len(d.Payload)-2)/2 < d.PayloadBytes
		sized += outbox.ContentTypeSizeExtra(d.ContentType) // as relay.SizedPayloadLen
	} else {
		if preview >= 0 && len(d.Payload) > preview {
			d.Payload = cutUTF8(d.Payload, preview)
		}
		d.PayloadTruncated = len(d.Payload) < d.PayloadBytes
	}
	var hm map[string]string
	if d.Headers == nil || json.Unmarshal(d.Headers, &hm) == nil {
		d.RecordBytes = outbox.KafkaRouting{}.RecordSize(d.ID, d.Type, sized, hm, "")
	}
}

// cutUTF8 cuts s to at most n bytes without splitting a character.
func cutUTF8(s string, n int) string {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// binaryTable reports whether t's outbox has binary payloads on (its
// payload_bytes column exists).
func binaryTable(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, t outbox.Tables) (bool, error) {
	var on bool
	if err := db.QueryRow(ctx, binaryColumnsSQL, t.OutboxIdent()).Scan(&on); err != nil {
		return false, fmt.Errorf("ops: read the payload columns of %s: %w", t.OutboxIdent(), err)
	}
	return on, nil
}

// binaryVariant renders plain, or binary when t's outbox has binary
// payloads on.
func binaryVariant(ctx context.Context, tx pgx.Tx, t outbox.Tables, plain, binary string) (string, error) {
	on, err := binaryTable(ctx, tx, t)
	if err != nil || !on {
		return render(plain, t), err
	}
	return render(binary, t), nil
}
