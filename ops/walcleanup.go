package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
)

// Retention of an outbox relayed from the WAL. Its rows keep
// dispatched_at NULL, and deleting a row does not take its event out of
// the WAL (the insert's WAL record carries the whole tuple; the
// publication publishes inserts only). What a row still is, until the
// slot has confirmed it, is the only other copy of its event: the one to
// republish from if the slot is lost or dropped. So cleanup deletes a row
// only once the slot's confirmed position is past the row's commit.
//
// A row's commit LSN cannot be read, but a bound can: walHorizonSQL takes,
// in one statement, the statement's snapshot and then the WAL insert
// position L. Every transaction that finished before the snapshot (xid
// below the snapshot's xmin) wrote its commit record before it finished,
// so that record ends at or before L. Cleanup waits until the slot's
// confirmed_flush_lsn reaches L (the relay confirms a position only once
// the broker acknowledged every transaction up to it), then deletes rows
// older than the retention whose xmin precedes that snapshot xmin. A row
// committed later, whatever its created_at (a long transaction), waits for
// the next run.

// walHorizon is a WAL position and the 32-bit xid before which every
// transaction had committed (or aborted) by then.
type walHorizon struct {
	lsn  string
	xmin int64
}

func readWALHorizon(ctx context.Context, db outbox.DB) (walHorizon, error) {
	var h walHorizon
	if err := db.QueryRow(ctx, walHorizonSQL).Scan(&h.lsn, &h.xmin); err != nil {
		return h, fmt.Errorf("ops: cleanup: read the WAL position: %w", err)
	}
	return h, nil
}

// waitWALHorizon notes the horizon and waits up to wait for slot to
// confirm it. It returns ErrSlotBehind (wrapped) when the slot is gone,
// lost or unreserved, or does not confirm in time.
func waitWALHorizon(ctx context.Context, db outbox.DB, slot string, wait time.Duration) (walHorizon, error) {
	h, err := readWALHorizon(ctx, db)
	if err != nil {
		return h, err
	}
	deadline := time.Now().Add(wait)
	for {
		var ok bool
		var status string
		err := db.QueryRow(ctx, walConfirmedSQL, slot, h.lsn).Scan(&ok, &status)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return h, fmt.Errorf("%w: slot %s does not exist; no outbox row was deleted (the table is the only copy of what it had not delivered)", ErrSlotBehind, slot)
		case err != nil:
			return h, fmt.Errorf("ops: cleanup: read slot %s: %w", slot, err)
		case status == "lost" || status == "unreserved":
			return h, fmt.Errorf("%w: slot %s has wal_status=%s; no outbox row was deleted (the table is where its missing events are republished from)", ErrSlotBehind, slot, status)
		case ok:
			return h, nil
		case time.Now().After(deadline):
			return h, fmt.Errorf("%w: slot %s did not confirm WAL position %s within %s (is a relay --mode wal leading?); no outbox row was deleted", ErrSlotBehind, slot, h.lsn, wait)
		}
		if !backoff.Sleep(ctx, 200*time.Millisecond) {
			return h, ctx.Err()
		}
	}
}

// cleanupOutboxWAL deletes the rows older than cutoff committed before
// h, in windows over the primary key as cleanupOutbox does.
func cleanupOutboxWAL(ctx context.Context, c *pgx.Conn, cfg CleanupConfig, log *slog.Logger, cutoff time.Time, h walHorizon, tc *TableCleanup) error {
	return cleanupOutboxWindows(ctx, c, cfg, log, tc, "wal", render(walCleanupSQL, cfg.Tables), cutoff, h.xmin)
}
