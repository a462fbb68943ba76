package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/cleanuplock"
	"github.com/pgoutbox/outbox/internal/durations"
	"github.com/pgoutbox/outbox/migrate"
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
	// deleted. Pending rows never are. A partitioned outbox's partitions
	// are dropped once their newest row is older than this (by
	// created_at). Defaults to DefaultRetention (7d).
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
	// is its own short transaction. At most 1000000. Defaults to
	// DefaultCleanupBatch (10000).
	BatchSize int
	// Pause between batches gives vacuum, replicas and the relay room.
	// Defaults to DefaultCleanupPause (100ms).
	Pause time.Duration
	// Source relays the outbox. For the WAL source (`outbox relay --mode
	// wal`), whose rows keep dispatched_at NULL, the outbox part deletes
	// rows older than Retention (by created_at) whatever their
	// dispatched_at, but only those committed before a WAL position the
	// slot has confirmed (see cleanupOutboxWAL). Defaults to Polling
	// (delete dispatched rows only).
	Source Source
	// WALConfirmWait is how long a WAL-mode cleanup waits for the slot to
	// confirm the position it noted at its start (a running relay does so
	// within a heartbeat); when it does not, no outbox row is deleted and
	// Cleanup returns ErrSlotBehind. Defaults to DefaultWALConfirmWait
	// (1m).
	WALConfirmWait time.Duration
	// Logger receives a debug line per batch. Defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultWALConfirmWait is CleanupConfig.WALConfirmWait's default.
const DefaultWALConfirmWait = time.Minute

// ErrSlotBehind is returned (wrapped, saying why) by a WAL-mode Cleanup
// that deleted no outbox row because the slot is missing, lost,
// unreserved, or did not confirm its start position within
// WALConfirmWait: the table is the only copy of events the slot may not
// have delivered.
var ErrSlotBehind = errors.New("ops: the replication slot has not confirmed the rows cleanup would delete")

// WithDefaults returns c with its zero fields set to their defaults.
// Negative values are left for Validate to refuse.
func (c CleanupConfig) WithDefaults() CleanupConfig {
	c.Tables = c.Tables.WithDefaults()
	if c.BatchSize == 0 {
		c.BatchSize = DefaultCleanupBatch
	}
	durations.Fill(c.durations())
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// durations lists c's durations with their defaults.
func (c *CleanupConfig) durations() []durations.Default {
	return []durations.Default{
		{Name: "Retention", V: &c.Retention, Def: DefaultRetention},
		{Name: "ProcessedRetention", V: &c.ProcessedRetention, Def: DefaultProcessedRetention},
		{Name: "Pause", V: &c.Pause, Def: DefaultCleanupPause},
		{Name: "WALConfirmWait", V: &c.WALConfirmWait, Def: DefaultWALConfirmWait},
	}
}

// Validate reports what Cleanup would refuse: a bad table name, a
// negative duration, a batch size out of range.
func (c CleanupConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	if c.BatchSize < 0 || c.BatchSize > 1_000_000 {
		return fmt.Errorf("ops: cleanup BatchSize is %d; use 1 to 1000000, or 0 for the default %d", c.BatchSize, DefaultCleanupBatch)
	}
	return durations.Check("cleanup", c.durations())
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
	// WALHorizon is, for a WAL-mode cleanup (CleanupConfig.Source), the
	// WAL position the slot confirmed before rows were deleted: every
	// deleted row was committed before it. Empty otherwise.
	WALHorizon string
	// Partitions is, for a partitioned outbox, what retention did to its
	// partitions (no row is deleted: Outbox stays zero); nil for a plain
	// one.
	Partitions *PartitionCleanup
}

// TableCleanup is one table's share of a cleanup.
type TableCleanup struct {
	Deleted  int64
	Batches  int
	Duration time.Duration
}

// Cleanup deletes dispatched outbox rows older than the retention and
// processed_events rows older than theirs, in batches of their own short
// transactions with a pause between them, and prunes stale failure records.
// It never deletes a pending row. A partitioned outbox
// (migrate.Migrator.EnablePartitioned) loses no row one by one: Cleanup
// makes its partitions ahead (EnsurePartitions), then detaches and drops
// every partition whose rows are all published and older than the
// retention, and reports those it keeps (CleanupResult.Partitions; see
// partitionretention.go).
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
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	conn, unlock, err := lockCleanup(ctx, pool, cfg.Tables)
	if err != nil {
		return res, err
	}
	defer unlock()

	c := conn.Conn()
	if err := c.QueryRow(ctx, cleanupCutoffsSQL,
		cfg.Retention.Microseconds(), cfg.ProcessedRetention.Microseconds()).Scan(&res.OutboxCutoff, &res.ProcessedCutoff); err != nil {
		return res, fmt.Errorf("ops: cleanup: read server time: %w", err)
	}
	log := cfg.Logger.With("outbox", cfg.Tables.OutboxIdent())

	// walErr is what the outbox's cleanup could not do, for a reason
	// that does not stop the rest of the cleanup.
	walErr, err := cleanupOutboxTable(ctx, pool, c, cfg, log, &res)
	if err != nil {
		return res, err
	}

	pruned, err := c.Exec(ctx, render(pruneFailuresSQL, cfg.Tables))
	if err != nil {
		return res, fmt.Errorf("ops: cleanup: prune failure records: %w", err)
	}
	res.Failures = pruned.RowsAffected()

	if !cfg.SkipProcessed {
		if err := cleanupProcessed(ctx, c, cfg, log, res.ProcessedCutoff, &res.Processed); err != nil {
			return res, err
		}
	}
	return res, walErr
}

// cleanupOutboxTable cleans the outbox table as its layout says: a
// partitioned one by dropping partitions, a plain one by deleting rows,
// and for the WAL source only what its slot has confirmed. walErr is
// ErrSlotBehind (or, for a partitioned outbox, a failure to make
// partitions ahead), which lets the rest of the cleanup run.
func cleanupOutboxTable(ctx context.Context, pool *pgxpool.Pool, c *pgx.Conn, cfg CleanupConfig, log *slog.Logger, res *CleanupResult) (walErr, err error) {
	layout, err := migrate.ReadPartitioning(ctx, c, cfg.Tables)
	if err != nil {
		return nil, err
	}
	switch {
	case layout.Layout == migrate.LayoutPartitioned:
		res.Partitions = &PartitionCleanup{}
		return cleanupPartitions(ctx, pool, c, cfg, log, res.OutboxCutoff, res.Partitions)
	case cfg.Source.IsWAL():
		h, err := waitWALHorizon(ctx, c, cfg.Source.Slot(), cfg.WALConfirmWait)
		switch {
		case errors.Is(err, ErrSlotBehind):
			return err, nil // the rest of the cleanup still runs
		case err != nil:
			return nil, err
		}
		res.WALHorizon = h.lsn
		return nil, cleanupOutboxWAL(ctx, c, cfg, log, res.OutboxCutoff, h, &res.Outbox)
	}
	return nil, cleanupOutbox(ctx, c, cfg, log, res.OutboxCutoff, &res.Outbox)
}

// lockCleanup takes the outbox's cleanup lock on a connection of pool. It
// returns ErrCleanupRunning when another process holds it; otherwise
// unlock releases the lock and gives the connection back.
func lockCleanup(ctx context.Context, pool *pgxpool.Pool, t outbox.Tables) (conn *pgxpool.Conn, unlock func(), err error) {
	conn, unlock, locked, err := cleanuplock.TryLock(ctx, pool, t)
	if err == nil && !locked {
		err = ErrCleanupRunning
	}
	return conn, unlock, err
}

// cleanupOutbox deletes dispatched outbox rows older than cutoff in
// windows over the primary key, and counts them into tc.
func cleanupOutbox(ctx context.Context, c *pgx.Conn, cfg CleanupConfig, log *slog.Logger, cutoff time.Time, tc *TableCleanup) error {
	return cleanupOutboxWindows(ctx, c, cfg, log, tc, "poll", render(outboxCleanupSQL, cfg.Tables), cutoff)
}

// cleanupOutboxWindows runs sql, a window delete over the primary key
// taking (after id, batch size, args...) and returning (deleted, scanned,
// last id, reached cutoff), window after window until a short window or
// the cutoff, pausing cfg.Pause between them, and counts into tc.
func cleanupOutboxWindows(ctx context.Context, c *pgx.Conn, cfg CleanupConfig, log *slog.Logger, tc *TableCleanup, mode, sql string, args ...any) error {
	start := time.Now()
	defer func() { tc.Duration = time.Since(start) }()
	var after int64
	for {
		var deleted, scanned, last int64
		var reachedCutoff bool
		batchStart := time.Now()
		if err := c.QueryRow(ctx, sql, append([]any{after, cfg.BatchSize}, args...)...).Scan(&deleted, &scanned, &last, &reachedCutoff); err != nil {
			return fmt.Errorf("ops: cleanup of %s after id %d: %w", cfg.Tables.OutboxIdent(), after, err)
		}
		tc.Batches++
		tc.Deleted += deleted
		after = last
		log.Debug("cleanup batch", "table", cfg.Tables.OutboxIdent(), "mode", mode, "deleted", deleted, "scanned", scanned, "last_id", last, "took", time.Since(batchStart).Round(time.Microsecond))
		if scanned < int64(cfg.BatchSize) || reachedCutoff {
			return nil
		}
		if !backoff.Sleep(ctx, cfg.Pause) {
			return ctx.Err()
		}
	}
}

// cleanupProcessed deletes processed_events rows older than cutoff, oldest
// first, and counts them into tc.
func cleanupProcessed(ctx context.Context, c *pgx.Conn, cfg CleanupConfig, log *slog.Logger, cutoff time.Time, tc *TableCleanup) error {
	start := time.Now()
	processedSQL := render(processedCleanupSQL, cfg.Tables)
	from := time.Time{}
	for {
		var deleted int64
		var newest *time.Time
		if err := c.QueryRow(ctx, processedSQL, cutoff, cfg.BatchSize, from).Scan(&deleted, &newest); err != nil {
			tc.Duration = time.Since(start)
			return fmt.Errorf("ops: cleanup of %s: %w", cfg.Tables.ProcessedIdent(), err)
		}
		tc.Batches++
		tc.Deleted += deleted
		log.Debug("cleanup batch", "table", cfg.Tables.ProcessedIdent(), "deleted", deleted)
		if deleted < int64(cfg.BatchSize) || newest == nil {
			break
		}
		from = *newest
		if !backoff.Sleep(ctx, cfg.Pause) {
			tc.Duration = time.Since(start)
			return ctx.Err()
		}
	}
	tc.Duration = time.Since(start)
	return nil
}
