package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/sqltext"
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

// walHorizonSQL: the statement's snapshot is taken before
// pg_current_wal_insert_lsn() is evaluated. The xmin is reduced to its
// 32-bit xid, what the xmin column holds.
const walHorizonSQL = `SELECT pg_current_wal_insert_lsn()::text, (pg_snapshot_xmin(pg_current_snapshot())::text::bigint % 4294967296)`

// walConfirmedSQL reports whether the slot ($1) has confirmed $2, and its
// wal_status; no row when the slot is gone.
const walConfirmedSQL = `SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false), coalesce(wal_status, '')
FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`

// walCleanupSQL is outboxCleanupSQL for a WAL-mode outbox: among the next
// $2 rows of the primary key after id $1, it deletes those created before
// $3 whose inserting transaction precedes xid $4 (modulo 2^32, as
// Postgres compares xids; '2' is a frozen row's, committed before any
// running transaction). A misjudged ancient xmin can only keep a row, never
// delete one committed after the horizon. Served by the primary key.
const walCleanupSQL = `WITH win AS MATERIALIZED (
  SELECT id, created_at, xmin AS x FROM {{outbox}}
  WHERE id > $1
  ORDER BY id
  LIMIT $2
), del AS (
  DELETE FROM {{outbox}} o
  WHERE o.id = ANY(ARRAY(SELECT id FROM win WHERE created_at < $3
    AND (x = '2'::xid OR ((($4::bigint - x::text::bigint) % 4294967296 + 4294967296) % 4294967296) BETWEEN 1 AND 2147483647)))
  RETURNING 1
)
SELECT (SELECT count(*) FROM del), (SELECT count(*) FROM win),
  coalesce((SELECT max(id) FROM win), $1),
  coalesce((SELECT bool_or(created_at >= $3) FROM win), false)`

var _ = sqltext.Register("ops", map[string]string{"walHorizonSQL": walHorizonSQL, "walConfirmedSQL": walConfirmedSQL, "walCleanupSQL": walCleanupSQL})

// walHorizon is a WAL position and the 32-bit xid before which every
// transaction had committed (or aborted) by then.
type walHorizon struct {
	lsn  string
	xmin int64
}

func readWALHorizon(ctx context.Context, db Queryer) (walHorizon, error) {
	var h walHorizon
	if err := db.QueryRow(ctx, walHorizonSQL).Scan(&h.lsn, &h.xmin); err != nil {
		return h, fmt.Errorf("ops: cleanup: read the WAL position: %w", err)
	}
	return h, nil
}

// waitWALHorizon notes the horizon and waits up to wait for slot to
// confirm it. It returns ErrSlotBehind (wrapped) when the slot is gone,
// lost or unreserved, or does not confirm in time.
func waitWALHorizon(ctx context.Context, db Queryer, slot string, wait time.Duration) (walHorizon, error) {
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
	start := time.Now()
	sql := render(walCleanupSQL, cfg.Tables)
	var after int64
	for {
		var deleted, scanned, last int64
		var reachedCutoff bool
		if err := c.QueryRow(ctx, sql, after, cfg.BatchSize, cutoff, h.xmin).Scan(&deleted, &scanned, &last, &reachedCutoff); err != nil {
			tc.Duration = time.Since(start)
			return fmt.Errorf("ops: cleanup of %s after id %d: %w", cfg.Tables.OutboxIdent(), after, err)
		}
		tc.Batches++
		tc.Deleted += deleted
		after = last
		log.Debug("cleanup batch", "table", cfg.Tables.OutboxIdent(), "mode", "wal", "deleted", deleted, "scanned", scanned, "last_id", last)
		if scanned < int64(cfg.BatchSize) || reachedCutoff {
			break
		}
		if !backoff.Sleep(ctx, cfg.Pause) {
			tc.Duration = time.Since(start)
			return ctx.Err()
		}
	}
	tc.Duration = time.Since(start)
	return nil
}
