package ops

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
)

// Cleanup defaults.
const (
	// DefaultRetention keeps dispatched rows a week: long enough to look
	// into last week's incident, short enough to keep the table small.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultProcessedRetention keeps consumers' dedupe rows 30 days. It
	// must exceed the longest time a record can be redelivered after it was
	// first processed (broker retention, consumer offset resets, replays):
	// a record redelivered after its dedupe row is gone is applied twice.
	DefaultProcessedRetention = 30 * 24 * time.Hour
	// DefaultCleanupBatch rows per delete statement.
	DefaultCleanupBatch = 10_000
	// DefaultCleanupPause between batches.
	DefaultCleanupPause = 100 * time.Millisecond
)

// ErrCleanupRunning is returned when another process (a relay replica, or
// a cron'd `outbox cleanup`) is cleaning the same outbox.
var ErrCleanupRunning = errors.New("ops: another cleanup of this outbox is running")

// CleanupConfig configures Cleanup.
type CleanupConfig struct {
	// Tables names the outbox and processed tables. Defaults to
	// public.events_outbox and public.processed_events.
	Tables outbox.Tables
	// Retention: dispatched rows older than this (by dispatched_at) are
	// deleted. Pending rows never are. Defaults to DefaultRetention (7d).
	Retention time.Duration
	// ProcessedRetention: processed_events rows older than this (by
	// processed_at) are deleted. Keep it longer than any redelivery window
	// (see DefaultProcessedRetention). Defaults to DefaultProcessedRetention
	// (30d).
	ProcessedRetention time.Duration
	// SkipProcessed leaves processed_events alone, e.g. when consumers keep
	// it in another database and clean it there. Defaults to false.
	SkipProcessed bool
	// BatchSize is the most rows one delete statement looks at. Each batch
	// is its own short transaction. Defaults to DefaultCleanupBatch.
	BatchSize int
	// Pause between batches gives vacuum, replicas and the relay room.
	// Defaults to DefaultCleanupPause.
	Pause time.Duration
	// Logger receives a debug line per batch. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c CleanupConfig) withDefaults() (CleanupConfig, error) {
	if err := c.Tables.Validate(); err != nil {
		return c, err
	}
	c.Tables = c.Tables.WithDefaults()
	if c.Retention < 0 || c.ProcessedRetention < 0 || c.Pause < 0 {
		return c, fmt.Errorf("ops: cleanup Retention (%s), ProcessedRetention (%s) and Pause (%s) must not be negative; 0 means the default", c.Retention, c.ProcessedRetention, c.Pause)
	}
	if c.BatchSize < 0 || c.BatchSize > 1_000_000 {
		return c, fmt.Errorf("ops: cleanup BatchSize is %d; use 1 to 1000000, or 0 for the default %d", c.BatchSize, DefaultCleanupBatch)
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.ProcessedRetention == 0 {
		c.ProcessedRetention = DefaultProcessedRetention
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultCleanupBatch
	}
	if c.Pause == 0 {
		c.Pause = DefaultCleanupPause
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// CleanupResult reports what Cleanup deleted.
type CleanupResult struct {
	// OutboxCutoff and ProcessedCutoff are the server times rows had to be
	// older than.
	OutboxCutoff, ProcessedCutoff time.Time
	Outbox, Processed             TableCleanup
	// Failures is how many failure records of rows no longer pending were
	// pruned.
	Failures int64
}

// TableCleanup is one table's share of a cleanup.
type TableCleanup struct {
	Deleted  int64
	Batches  int
	Duration time.Duration
}

// outboxCleanupSQL deletes the old dispatched rows among the next $2 rows
// of the primary key after id $1 (the window), and reports how many it
// deleted, how many it looked at, the last id it looked at and whether it
// reached rows created after the cutoff $3.
//
// There is no index on dispatched_at: old dispatched rows sit at the low
// end of the primary key, so the job walks it from the start in windows
// of $2 rows, each statement one bounded index range scan whatever the
// table's size. It stops at the first window holding a row created after
// the cutoff: rows after it are younger than the retention (a row is
// dispatched after it is created), so the last batch does not scan the
// recent part of the table. A rare row created before the cutoff but
// numbered after that (a long inserting transaction) waits for the next
// run.
//
// dispatched_at < $3 is repeated on the DELETE itself so that Postgres
// re-checks it on the row's latest version should it have changed after
// the window's snapshot: a pending row (dispatched_at NULL) can never
// match, whatever a relayer does to it meanwhile.
const outboxCleanupSQL = `WITH win AS MATERIALIZED (
  SELECT id, created_at, dispatched_at FROM {{outbox}}
  WHERE id > $1
  ORDER BY id
  LIMIT $2
), del AS (
  DELETE FROM {{outbox}} o
  WHERE o.id = ANY(ARRAY(SELECT id FROM win WHERE dispatched_at < $3)) AND o.dispatched_at < $3
  RETURNING 1
)
SELECT (SELECT count(*) FROM del), (SELECT count(*) FROM win),
  coalesce((SELECT max(id) FROM win), $1),
  coalesce((SELECT bool_or(created_at >= $3) FROM win), false)`

// processedCleanupSQL deletes the oldest $2 dedupe rows processed before
// $1, walking the processed_at index from $3 (the last batch's newest
// processed_at: a keyset, so no batch re-walks the dead index entries its
// predecessors left). Returns the count and the newest processed_at
// deleted.
const processedCleanupSQL = `WITH doomed AS MATERIALIZED (
  SELECT consumer, source, event_id, processed_at FROM {{processed}}
  WHERE processed_at >= $3 AND processed_at < $1
  ORDER BY processed_at
  LIMIT $2
), del AS (
  DELETE FROM {{processed}} p USING doomed d
  WHERE p.consumer = d.consumer AND p.source = d.source AND p.event_id = d.event_id AND p.processed_at < $1
  RETURNING p.processed_at
)
SELECT count(*), max(processed_at) FROM del`

// pruneFailuresSQL drops failure records of rows that are no longer
// pending (dispatched at last, or deleted by hand). The failures table
// holds a handful of rows; each is one primary-key probe.
const pruneFailuresSQL = `DELETE FROM {{failures}} f
WHERE NOT EXISTS (SELECT 1 FROM {{outbox}} o WHERE o.id = f.event_id AND o.dispatched_at IS NULL)`

// Cleanup deletes dispatched outbox rows older than the retention and
// processed_events rows older than theirs, in batches of their own short
// transactions with a pause between them, and prunes stale failure records.
// It never deletes a pending row.
//
// One cleanup runs per outbox at a time: Cleanup holds a session advisory
// lock on one of pool's connections while it runs and returns
// ErrCleanupRunning at once when another process holds it. The lock dies
// with the connection, so a killed cleanup does not block the next.
//
// When ctx is cancelled between batches, Cleanup returns what it did so
// far and ctx's error; every finished batch stays committed.
func Cleanup(ctx context.Context, pool *pgxpool.Pool, cfg CleanupConfig) (CleanupResult, error) {
	var res CleanupResult
	cfg, err := cfg.withDefaults()
	if err != nil {
		return res, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("ops: cleanup: connect: %w", err)
	}
	ns := cleanupLockKey(cfg.Tables)
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1::int4, $2::int4)", ns, cleanupLockID).Scan(&locked); err != nil {
		conn.Release()
		return res, fmt.Errorf("ops: cleanup: take the cleanup lock: %w", err)
	}
	if !locked {
		conn.Release()
		return res, ErrCleanupRunning
	}
	defer func() {
		// A session lock outlives the borrow: release it before the
		// connection goes back to the pool, or close the connection.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1::int4, $2::int4)", ns, cleanupLockID); err != nil {
			_ = conn.Hijack().Close(uctx)
			return
		}
		conn.Release()
	}()

	c := conn.Conn()
	if err := c.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond', now() - $2::bigint * interval '1 microsecond'`,
		cfg.Retention.Microseconds(), cfg.ProcessedRetention.Microseconds()).Scan(&res.OutboxCutoff, &res.ProcessedCutoff); err != nil {
		return res, fmt.Errorf("ops: cleanup: read server time: %w", err)
	}
	log := cfg.Logger.With("outbox", cfg.Tables.OutboxIdent())

	// Outbox: windows over the primary key.
	start := time.Now()
	outboxSQL := render(outboxCleanupSQL, cfg.Tables)
	var after int64
	for {
		var deleted, scanned, last int64
		var reachedCutoff bool
		batchStart := time.Now()
		if err := c.QueryRow(ctx, outboxSQL, after, cfg.BatchSize, res.OutboxCutoff).Scan(&deleted, &scanned, &last, &reachedCutoff); err != nil {
			res.Outbox.Duration = time.Since(start)
			return res, fmt.Errorf("ops: cleanup of %s after id %d: %w", cfg.Tables.OutboxIdent(), after, err)
		}
		res.Outbox.Batches++
		res.Outbox.Deleted += deleted
		after = last
		log.Debug("cleanup batch", "table", cfg.Tables.OutboxIdent(), "deleted", deleted, "scanned", scanned, "last_id", last, "took", time.Since(batchStart).Round(time.Microsecond))
		if scanned < int64(cfg.BatchSize) || reachedCutoff {
			break
		}
		if !backoff.Sleep(ctx, cfg.Pause) {
			res.Outbox.Duration = time.Since(start)
			return res, ctx.Err()
		}
	}
	res.Outbox.Duration = time.Since(start)

	pruned, err := c.Exec(ctx, render(pruneFailuresSQL, cfg.Tables))
	if err != nil {
		return res, fmt.Errorf("ops: cleanup: prune failure records: %w", err)
	}
	res.Failures = pruned.RowsAffected()

	if !cfg.SkipProcessed {
		start := time.Now()
		processedSQL := render(processedCleanupSQL, cfg.Tables)
		from := time.Time{}
		for {
			var deleted int64
			var newest *time.Time
			if err := c.QueryRow(ctx, processedSQL, res.ProcessedCutoff, cfg.BatchSize, from).Scan(&deleted, &newest); err != nil {
				res.Processed.Duration = time.Since(start)
				return res, fmt.Errorf("ops: cleanup of %s: %w", cfg.Tables.ProcessedIdent(), err)
			}
			res.Processed.Batches++
			res.Processed.Deleted += deleted
			log.Debug("cleanup batch", "table", cfg.Tables.ProcessedIdent(), "deleted", deleted)
			if deleted < int64(cfg.BatchSize) || newest == nil {
				break
			}
			from = *newest
			if !backoff.Sleep(ctx, cfg.Pause) {
				res.Processed.Duration = time.Since(start)
				return res, ctx.Err()
			}
		}
		res.Processed.Duration = time.Since(start)
	}
	return res, nil
}

// cleanupLockID is the second key of the cleanup's advisory lock; the
// first is fixed per outbox table (cleanupLockKey).
const cleanupLockID = 1

// cleanupLockKey namespaces the two-key advisory lock by outbox table, apart
// from Emit's per-aggregate locks and the application's own.
func cleanupLockKey(t outbox.Tables) int32 {
	h := fnv.New32a()
	h.Write([]byte("outbox-ops:" + t.Schema + "." + t.Outbox))
	return int32(h.Sum32())
}
