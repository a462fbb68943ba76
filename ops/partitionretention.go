package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/migrate"
)

// Retention of a partitioned outbox drops whole partitions instead of
// deleting rows: no WAL, no vacuum, no I/O for the rows dropped. A
// partition is due once ids are no longer drawn into it and its newest row
// is older than the retention. It is dropped only if it holds no pending
// row (polling source: all dispatched) and no parked row's id (that row
// could not be unparked), or, for the WAL source, once the slot confirmed
// a position after every transaction that wrote it.
//
// Its rows can still change after it looked done: an insert that drew an
// id in its range long ago may not have committed, a replay may set rows
// back to pending. So it is detached first, with DETACH PARTITION ...
// CONCURRENTLY, which lets producers and relayers go on and waits for
// every transaction that uses the table or the partition to end; then,
// under an ACCESS EXCLUSIVE lock on the detached table, checked again
// (polling: no pending row; WAL: the slot confirms the WAL position read
// now, after every commit into it) and dropped in the same transaction,
// or attached back and reported (KeptInFlight, KeptSlotBehind). Nothing
// is dropped that was not published.
//
// Which partition a run is detaching is recorded first
// (migrate.DetachIntent). A process killed mid-way leaves the partition
// detach-pending (its session ends with it: connCheckSQL) or detached; the
// next run finishes the detach (FINALIZE), checks it again, and drops it
// or attaches it back, and says so in the log. The drop itself is one
// transaction: a kill loses nothing.

// PartitionCleanup is what a partitioned outbox's retention did.
type PartitionCleanup struct {
	// Ensure is the partitions made ahead first, and the headroom.
	Ensure EnsureResult
	// Dropped partitions, detached and dropped.
	Dropped []PartitionRange
	// Kept partitions were due but are kept, each with why.
	Kept []KeptPartition
	// Finished names the partitions an earlier run left half detached,
	// which this one dropped or attached back.
	Finished []string
}

// retention is one retention run of a partitioned outbox, on the cleanup
// lock's connection c (DETACH CONCURRENTLY runs there, outside any
// transaction) and pool (Attach, EnsurePartitions).
type retention struct {
	ctx  context.Context
	pool *pgxpool.Pool
	c    *pgx.Conn
	cfg  CleanupConfig
	log  *slog.Logger
	pc   *PartitionCleanup
}

// ErrPartitionsAhead is returned (wrapped, joined with any other) by a
// Cleanup of a partitioned outbox that could not make the partitions
// ahead of its id sequence (EnsurePartitions); the rest of the cleanup
// ran.
var ErrPartitionsAhead = errors.New("ops: could not make the partitions ahead")

// cleanupPartitions runs retention for a partitioned outbox: partitions
// ahead, an interrupted detach finished, then every due partition dropped
// or kept. A WAL source's slot that is behind keeps every partition
// (ErrSlotBehind), and partitions that could not be made ahead are
// ErrPartitionsAhead: both are returned as walErr, after the rest ran.
func cleanupPartitions(ctx context.Context, pool *pgxpool.Pool, c *pgx.Conn, cfg CleanupConfig, log *slog.Logger, cutoff time.Time, pc *PartitionCleanup) (walErr, err error) {
	ens, ensErr := EnsurePartitions(ctx, pool, PartitionConfig{Tables: cfg.Tables, Logger: log})
	pc.Ensure = ens
	if ensErr != nil {
		ensErr = fmt.Errorf("%w: %w", ErrPartitionsAhead, ensErr)
		log.Warn("could not make partitions ahead; retention goes on", "err", ensErr)
	}
	var pgErr *pgconn.PgError
	if _, err := c.Exec(ctx, connCheckSQL, "1s"); err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42704") { // before PG 14
		return nil, fmt.Errorf("ops: cleanup: %w", err)
	}
	defer c.Exec(context.WithoutCancel(ctx), connCheckSQL, "0") //nolint:errcheck // the session goes back to the pool
	r := &retention{ctx: ctx, pool: pool, c: c, cfg: cfg, log: log, pc: pc}
	if err := r.finishInterrupted(); err != nil {
		return nil, err
	}
	infos, _, err := ListPartitions(ctx, c, PartitionListConfig{Tables: cfg.Tables, Source: cfg.Source, Retention: cfg.Retention})
	if err != nil {
		return nil, err
	}
	if cfg.Source.IsWAL() {
		if _, walErr = waitWALHorizon(ctx, c, cfg.Source.Slot(), cfg.WALConfirmWait); walErr != nil && !errors.Is(walErr, ErrSlotBehind) {
			return nil, walErr
		}
	}
	for _, info := range infos {
		if slices.Contains(pc.Finished, info.Name) {
			continue // settled above: dropped, or attached back and reported
		}
		switch {
		case info.Droppable && walErr != nil:
			r.keep(KeptPartition{PartitionRange: info.PartitionRange, Reason: KeptSlotBehind, Detail: walErr.Error()})
		case info.Droppable:
			if err := r.drop(info.PartitionRange); err != nil {
				return walErr, err
			}
		case info.Reason != "":
			r.keep(KeptPartition{PartitionRange: info.PartitionRange, Reason: info.Reason, Detail: info.Why})
		}
		if ctx.Err() != nil {
			return walErr, ctx.Err()
		}
	}
	if err := r.record(cutoff.Add(cfg.Retention)); err != nil {
		return walErr, err
	}
	return errors.Join(walErr, ensErr), nil
}

// drop detaches a due partition, then checks and drops it (settle).
func (r *retention) drop(p PartitionRange) error {
	in := migrate.DetachIntent{Name: p.Name, From: p.From, To: p.To}
	if err := r.setIntent(&in); err != nil {
		return err
	}
	if err := partition.DetachConcurrently(r.ctx, r.c, r.cfg.Tables.Schema, r.cfg.Tables.Outbox, p.Name); err != nil {
		return fmt.Errorf("ops: cleanup: %w (the next cleanup finishes the detach, or attaches the partition back)", err)
	}
	return r.settle(in)
}

// settle drops the detached partition in, or attaches it back when its
// rows must stay.
func (r *retention) settle(in migrate.DetachIntent) error {
	p := PartitionRange{Name: in.Name, From: in.From, To: in.To}
	kept, err := r.dropDetached(in)
	if err != nil {
		return err
	}
	if kept == nil {
		r.pc.Dropped = append(r.pc.Dropped, p)
		r.log.Info("dropped partition", "partition", p.Name, "from_id", p.From, "to_id", p.To-1)
		return nil
	}
	if err := partition.Attach(r.ctx, r.pool, r.cfg.Tables.Schema, r.cfg.Tables.Outbox, in.Name, in.From, in.To); err != nil {
		return fmt.Errorf("ops: cleanup: %w (the next cleanup tries again)", err)
	}
	if err := r.setIntent(nil); err != nil {
		return err
	}
	r.log.Warn("attached partition back: its rows must stay", "partition", p.Name, "from_id", p.From, "to_id", p.To-1, "reason", kept.Reason, "detail", kept.Detail)
	r.keep(*kept)
	return nil
}

// dropDetached checks the detached partition in again under an ACCESS
// EXCLUSIVE lock and drops it in the same transaction, clearing the
// intent; or returns why it must stay.
func (r *retention) dropDetached(in migrate.DetachIntent) (*KeptPartition, error) {
	ctx, t := r.ctx, r.cfg.Tables
	partQ := pgident.Qualified(t.Schema, in.Name)
	kept := func(reason, detail string) *KeptPartition {
		return &KeptPartition{PartitionRange: PartitionRange{Name: in.Name, From: in.From, To: in.To}, Reason: reason, Detail: detail}
	}
	tx, err := r.c.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("ops: cleanup: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := tx.Exec(ctx, fmt.Sprintf(lockDetachedSQL, partQ)); err != nil {
		return nil, fmt.Errorf("ops: cleanup: lock the detached partition %s: %w", partQ, err)
	}
	var pending, parked int64
	if !r.cfg.Source.IsWAL() {
		if err := tx.QueryRow(ctx, fmt.Sprintf(detachedPendingSQL, partQ)).Scan(&pending); err != nil {
			return nil, fmt.Errorf("ops: cleanup: check the detached partition %s: %w", partQ, err)
		}
	}
	if err := tx.QueryRow(ctx, render(parkedInRangeSQL, t), in.From, in.To).Scan(&parked); err != nil {
		return nil, fmt.Errorf("ops: cleanup: check the parked rows of partition %s: %w", partQ, err)
	}
	switch {
	case pending > 0:
		return kept(KeptInFlight, fmt.Sprintf("%d rows became pending in it while it was being detached (an insert in flight when it looked done, or a replay)", pending)), nil
	case parked > 0:
		return kept(KeptParked, fmt.Sprintf("%d rows were parked from it meanwhile", parked)), nil
	}
	if r.cfg.Source.IsWAL() {
		// Every transaction that wrote it has ended (the detach waited
		// for them): the WAL position now is after their commits.
		if _, err := waitWALHorizon(ctx, tx, r.cfg.Source.Slot(), r.cfg.WALConfirmWait); errors.Is(err, ErrSlotBehind) {
			return kept(KeptSlotBehind, err.Error()), nil
		} else if err != nil {
			return nil, err
		}
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(dropDetachedSQL, partQ)); err != nil {
		return nil, fmt.Errorf("ops: cleanup: drop the detached partition %s: %w", partQ, err)
	}
	if _, err := tx.Exec(ctx, render(setDetachingSQL, t), nil, nil, nil); err != nil {
		return nil, fmt.Errorf("ops: cleanup: %w", err)
	}
	return nil, tx.Commit(ctx)
}

// finishInterrupted finishes what an earlier run left: the partition it
// recorded as detaching (finished, checked, dropped or attached back), and
// any other detach-pending partition (finished and attached back: this
// run did not judge it).
func (r *retention) finishInterrupted() error {
	ctx, t := r.ctx, r.cfg.Tables
	p, err := migrate.ReadPartitioning(ctx, r.c, t)
	if err != nil {
		return err
	}
	if in := p.Detaching; in.Name != "" {
		st, err := partition.StateOf(ctx, r.c, t.Schema, t.Outbox, in.Name)
		if err != nil {
			return err
		}
		if st == partition.DetachPending {
			r.log.Warn("finishing the detach of a partition that an earlier cleanup began and did not finish", "partition", in.Name)
			if err := partition.Finalize(ctx, r.c, t.Schema, t.Outbox, in.Name); err != nil {
				return fmt.Errorf("ops: cleanup: %w", err)
			}
			st = partition.Detached
		}
		if st != partition.Detached {
			// Gone: dropped before the intent was cleared; attached: the
			// detach never began.
			return r.setIntent(nil)
		}
		r.log.Warn("checking a partition an earlier cleanup detached and did not drop", "partition", in.Name)
		r.pc.Finished = append(r.pc.Finished, in.Name)
		if err := r.settle(in); err != nil {
			return err
		}
	}
	parts, err := partition.List(ctx, r.c, t.OutboxIdent())
	if err != nil {
		return err
	}
	for _, part := range parts {
		if !part.DetachPending {
			continue
		}
		r.log.Warn("finishing a detach this cleanup did not record, then attaching the partition back", "partition", part.Name)
		if err := partition.Finalize(ctx, r.c, t.Schema, t.Outbox, part.Name); err != nil {
			return fmt.Errorf("ops: cleanup: %w", err)
		}
		if err := partition.Attach(ctx, r.pool, t.Schema, t.Outbox, part.Name, part.From, part.To); err != nil {
			return fmt.Errorf("ops: cleanup: %w", err)
		}
		r.pc.Finished = append(r.pc.Finished, part.Name)
	}
	return nil
}

// keep records a kept partition and logs it.
func (r *retention) keep(k KeptPartition) {
	r.pc.Kept = append(r.pc.Kept, k)
	r.log.Warn("partition past the retention kept", "partition", k.Name, "from_id", k.From, "to_id", k.To-1, "reason", k.Reason, "detail", k.Detail)
}

// setIntent records the partition the run is about to detach, or clears
// the record (nil).
func (r *retention) setIntent(in *migrate.DetachIntent) error {
	args := []any{nil, nil, nil}
	if in != nil {
		args = []any{in.Name, in.From, in.To}
	}
	if _, err := r.c.Exec(r.ctx, render(setDetachingSQL, r.cfg.Tables), args...); err != nil {
		return fmt.Errorf("ops: cleanup: record the partition being detached: %w", err)
	}
	return nil
}

// record writes the run's outcome for stats and the watchdog of every
// process.
func (r *retention) record(at time.Time) error {
	run := RetentionRun{At: at, Retention: r.cfg.Retention, Dropped: r.pc.Dropped, Kept: r.pc.Kept}
	raw, err := json.Marshal(run)
	if err == nil {
		_, err = r.c.Exec(r.ctx, render(recordRetentionSQL, r.cfg.Tables), raw)
	}
	if err != nil {
		return fmt.Errorf("ops: cleanup: record the retention run: %w", err)
	}
	return nil
}
