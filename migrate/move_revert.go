package migrate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// Revert moves m's partitioned outbox table back to the plain layout
// while producers and relayers run, in one short transaction (see the
// comment at the top of move.go): the pending rows are copied into a new
// plain table under the outbox's name (the WAL source, which never marks
// a row, does not send the copies: they are written before the new table
// is published), and the partitioned table is kept
// as <outbox>_retired, which cleanup drops after the retention
// (DropRetired). On a plain table it does nothing. It refuses while a
// partition's detach is unfinished (run cleanup first), while more than
// MaxCopy rows are pending, and while an earlier revert's retired table
// is still there.
func (m *Migrator) Revert(ctx context.Context, db outbox.DB, cfg MoveConfig) (MoveResult, error) {
	var res MoveResult
	cfg = cfg.withDefaults()
	if err := m.Validate(ctx, db); err != nil {
		return res, err
	}
	s, err := m.readTableState(ctx, db)
	if err != nil {
		return res, err
	}
	if s.kind != "p" {
		res.State = s.move
		return res, nil
	}
	if s.moving && s.move.Retired != "" {
		return res, fmt.Errorf("%w: an earlier revert's table %s is still there; cleanup drops it once the retention has passed, or drop it yourself (DROP TABLE %s), then run again",
			ErrMoveRefused, s.move.Retired, pgident.Qualified(m.tables.Schema, s.move.Retired))
	}
	cfg.BeforeStep(StepSwap)
	cfg.Logger.Info("swapping in a plain table", "outbox", m.tables.OutboxIdent())
	err = m.inLocked(ctx, db, func(tx pgx.Tx) error {
		var err error
		res.Copied, err = m.swapPlain(ctx, tx, cfg)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("migrate: revert %s: %w", m.ids.Outbox, err)
	}
	res.Done = []string{StepSwap}
	res.State, _, err = m.ReadMove(ctx, db)
	return res, err
}

// swapPlain is the revert's transaction; it returns the rows copied.
func (m *Migrator) swapPlain(ctx context.Context, tx pgx.Tx, cfg MoveConfig) (int64, error) {
	if _, err := tx.Exec(ctx, sqltext.Render(lockOutboxSQL, m.ids)); err != nil {
		return 0, err
	}
	var pendingDetach int64
	var detaching *string
	if err := tx.QueryRow(ctx, sqltext.Render(moveBlockersSQL, m.ids)).Scan(&pendingDetach, &detaching); err != nil {
		return 0, err
	}
	if pendingDetach > 0 || detaching != nil {
		return 0, fmt.Errorf("%w: retention left a partition half detached; run `outbox cleanup` to finish it, then run again", ErrMoveRefused)
	}
	var pending int64
	if err := tx.QueryRow(ctx, sqltext.Render(pendingCountSQL, m.ids)).Scan(&pending); err != nil {
		return 0, err
	}
	if pending > cfg.MaxCopy {
		return 0, fmt.Errorf("%w: %d rows are pending, more than the %d a revert copies under its lock; let the relay drain the backlog (or raise --max-copy) and run again; an outbox relayed from the WAL keeps every row pending until cleanup deletes it past the retention (outbox cleanup)", ErrMoveRefused, pending, cfg.MaxCopy)
	}
	var pkey string
	if err := tx.QueryRow(ctx, pkeyNameSQL, m.ids.Outbox).Scan(&pkey); err != nil {
		return 0, fmt.Errorf("read the primary key of %s: %w", m.ids.Outbox, err)
	}
	if _, err := tx.Exec(ctx, sqltext.Render(createMoveSQL, m.ids)); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, sqltext.Render(beginMoveSQL, m.ids), MoveRevert, StepSwap, nil); err != nil {
		return 0, err
	}
	for _, stmt := range m.revertScript(pkey) {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return 0, fmt.Errorf("%w (in: %.120s)", err, stmt)
		}
	}
	if _, err := tx.Exec(ctx, sqltext.Render(retireSQL, m.ids), m.trimmed("_retired")); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, sqltext.Render(stepMoveSQL, m.ids), StepDone, true); err != nil {
		return 0, err
	}
	cfg.BeforeStep("swap-locked")
	return pending, nil
}

// revertScript is the revert's SQL: a plain twin, with the pending rows
// copied, takes the name of the partitioned table (primary key
// pkey), which becomes <outbox>_retired.
func (m *Migrator) revertScript(pkey string) []string {
	schema := m.tables.Schema
	tmp, retired := m.trimmed("_plain"), m.trimmed("_retired")
	tmpQ := pgident.Qualified(schema, tmp)
	stmts := []string{
		fmt.Sprintf(sqltext.Render(createPlainSQL, m.ids), tmpQ, pgident.Quote(trim(tmp+"_pkey"))),
		fmt.Sprintf(sqltext.Render(createPendingSQL, m.ids), pgident.Quote(trim(tmp+"_pending_idx")), tmpQ),
		fmt.Sprintf(sqltext.Render(copyPendingSQL, m.ids), tmpQ),
	}
	return append(stmts,
		fmt.Sprintf(sqltext.Render(copyTriggersSQL, m.ids), tmpQ),
		fmt.Sprintf(sqltext.Render(copyGrantsSQL, m.ids), tmpQ),
		fmt.Sprintf(sqltext.Render(renameConstraintSQL, m.ids), pgident.Quote(pkey), pgident.Quote(trim(retired+"_pkey"))),
		fmt.Sprintf(renameIndexSQL, pgident.Qualified(schema, m.trimmed("_pending_idx")), pgident.Quote(trim(retired+"_pending_idx"))),
		fmt.Sprintf(sqltext.Render(renameOutboxSQL, m.ids), pgident.Quote(retired)),
		fmt.Sprintf(renameTableSQL, tmpQ, pgident.Quote(m.tables.Outbox)),
		fmt.Sprintf(sqltext.Render(renamePKeySQL, m.ids), pgident.Quote(trim(tmp+"_pkey")), pgident.Quote(m.trimmed("_pkey"))),
		fmt.Sprintf(sqltext.Render(renamePendingSQL, m.ids), pgident.Qualified(schema, trim(tmp+"_pending_idx"))),
		sqltext.Render(seqOwnSQL, m.ids),
		fmt.Sprintf(sqltext.Render(republishSQL, m.ids), pgident.Qualified(schema, retired), "false"),
		sqltext.Render(dropPartitioningSQL, m.ids),
		sqltext.Render(partitionedUnmarkSQL, m.ids),
	)
}

// DropRetired drops the table an earlier Revert retired once it was
// retired before cutoff (now minus the retention: every row in it was
// published or copied, and is past the retention), and returns its name;
// "" when there was none to drop yet. Cleanup of a plain outbox runs it.
func (m *Migrator) DropRetired(ctx context.Context, db outbox.DB, cutoff time.Time) (string, error) {
	st, found, err := m.ReadMove(ctx, db)
	if err != nil || !found || st.Retired == "" || !st.RetiredAt.Before(cutoff) {
		return "", err
	}
	err = m.inLocked(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(dropRetiredSQL, pgident.Qualified(m.tables.Schema, st.Retired))); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqltext.Render(unretireSQL, m.ids))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("migrate: drop the retired table %s: %w", st.Retired, err)
	}
	return st.Retired, nil
}

// PlanMove says, without changing anything, what Convert (direction
// MoveConvert) or Revert (MoveRevert) would do from where m's outbox
// table stands: one line per step with what it locks. What `outbox
// partitions convert|revert --dry-run` prints.
func (m *Migrator) PlanMove(ctx context.Context, db outbox.DB, direction string, cfg MoveConfig) ([]string, error) {
	cfg = cfg.withDefaults()
	s, err := m.readTableState(ctx, db)
	if err != nil {
		return nil, err
	}
	t, w := m.tables.OutboxIdent(), cfg.Settings.Width
	swap := "swap: one transaction under ACCESS EXCLUSIVE on " + t + " (waits at most " + binaryLockTimeout + " for the claims and inserts in flight, retried): "
	if direction == MoveRevert {
		if s.kind != "p" {
			return []string{t + " is plain: nothing to do"}, nil
		}
		var pending int64
		if err := db.QueryRow(ctx, sqltext.Render(pendingCountSQL, m.ids)).Scan(&pending); err != nil {
			return nil, err
		}
		return []string{swap + fmt.Sprintf("a plain table takes its name, sequence, triggers, grants and publications, with its %d pending rows copied; the partitioned table becomes %s, which cleanup drops after the retention", pending, m.trimmed("_retired"))}, nil
	}
	if s.kind == "p" {
		return []string{t + " is partitioned: nothing to do"}, nil
	}
	bound := ((s.next+cfg.Headroom)/w + 1) * w
	var steps []string
	if !s.bounded {
		steps = append(steps, fmt.Sprintf("bound: ADD CONSTRAINT partition_bounds CHECK (id >= 0 AND id < %d) NOT VALID (ACCESS EXCLUSIVE for an instant; the sequence is at %d; inserts at or past the bound fail until the swap)", bound, s.next))
	} else if s.moving {
		bound = s.move.Bound
	}
	if !s.validated {
		steps = append(steps, "validate: VALIDATE CONSTRAINT partition_bounds, one scan of the table under SHARE UPDATE EXCLUSIVE (producers, relayers and cleanup go on)")
	}
	steps = append(steps, swap+fmt.Sprintf("%s becomes its partition %s for ids 0 to %d (no scan, indexes attached), a partitioned table takes its name with partitions of %d ids from %d, publications follow it (publish_via_partition_root)",
		t, partition.Name(m.tables.Outbox, 0), bound-1, w, bound))
	return steps, nil
}
