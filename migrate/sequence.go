package migrate

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// ErrSequenceCached is returned by Validate when the outbox's id sequence
// hands out ids more than one at a time (a CACHE above 1).
var ErrSequenceCached = errors.New("migrate: the outbox's id sequence caches ids")

// checkSequenceCache fails with ErrSequenceCached when the sequence behind
// the outbox's id column caches ids. Each session then draws from a block
// of its own, so one can insert an id lower than ids other sessions
// committed before it: the relay, which publishes in id order, sends an
// aggregate's later event before its earlier one (Emit's aggregate lock
// orders commits, not cached ids), and on the partitioned layout an insert
// can fall in a partition retention already dropped.
func (m *Migrator) checkSequenceCache(ctx context.Context, db outbox.DB) error {
	var (
		seq   string
		cache int64
	)
	err := db.QueryRow(ctx, idSeqCacheSQL, m.ids.Outbox, m.ids.IDSeq).Scan(&seq, &cache)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no sequence: ids come from elsewhere, nothing cached here
	}
	if err != nil {
		return fmt.Errorf("migrate: read the id sequence of %s: %w", m.tables.OutboxIdent(), err)
	}
	if cache > 1 {
		return fmt.Errorf("%w: %s, the id sequence of %s, has CACHE %d, so a session can insert ids lower than ids other sessions have committed since, and the relay would publish an aggregate's events out of order (and, partitioned, insert into dropped partitions); run ALTER SEQUENCE %s CACHE 1 as its owner (sessions drop the ids they cached at their next insert)", ErrSequenceCached, seq, m.tables.OutboxIdent(), cache, seq)
	}
	return nil
}
