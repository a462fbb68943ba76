package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/migrate"
)

// The partitioned layout (migrate.Migrator.EnablePartitioned): ranges of
// ids, their bounds multiples of the width. The scenario makes the
// partitions itself, exactly those its rows need and a few ahead, so that
// the counts are what its tables say, and so that ops.Cleanup's
// EnsurePartitions makes none in the middle of the measurement.

// partitionAhead is the layout's Ahead setting in the scenario: a minute,
// so that the headroom EnsurePartitions keeps is its floor of two widths
// whatever rate the compressed time shows.
const partitionAhead = time.Minute

// Statements that take a partition out of a partitioned outbox in the
// scenario's setup, before any row is written.
const (
	detachPartitionSQL = `ALTER TABLE %s DETACH PARTITION %s`
	dropTableSQL       = `DROP TABLE %s`
)

// partitionOutbox makes e's empty outbox partitioned, width ids a
// partition, with exactly the partitions of the ids [from, to) (both
// multiples of width).
func partitionOutbox(ctx context.Context, e *env, width, from, to int64) error {
	m, err := migrate.New(e.tables)
	if err != nil {
		return err
	}
	if _, err := m.EnablePartitioned(ctx, e.pool, migrate.PartitionSettings{Width: width, Ahead: partitionAhead}); err != nil {
		return fmt.Errorf("partition %s: %w", e.tables.OutboxIdent(), err)
	}
	for lo := from; lo < to; lo += width {
		if _, err := partition.Add(ctx, e.pool, e.tables, e.tables.Outbox, lo, lo+width); err != nil {
			return err
		}
	}
	parts, err := partition.List(ctx, e.pool, e.tables.OutboxIdent())
	if err != nil {
		return err
	}
	for _, p := range parts {
		if p.From >= from && p.To <= to {
			continue
		}
		q := pgident.Qualified(e.tables.Schema, p.Name)
		if err := e.exec(ctx, fmt.Sprintf(detachPartitionSQL, e.tables.OutboxIdent(), q)); err != nil {
			return err
		}
		if err := e.exec(ctx, fmt.Sprintf(dropTableSQL, q)); err != nil {
			return err
		}
	}
	return nil
}
