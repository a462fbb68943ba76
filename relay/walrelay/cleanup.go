package walrelay

import (
	"context"
	"fmt"
	"time"

	"github.com/pgoutbox/outbox"
)

// cleanupSQL deletes up to $2 rows created before $1, oldest ids first, by
// primary key. For this source a row's state does not matter: its event
// is in the WAL, which the slot keeps until the broker has it, whether or
// not the row is still there.
const cleanupSQL = `DELETE FROM {{outbox}} WHERE id = ANY(ARRAY(
  SELECT id FROM {{outbox}} WHERE created_at < $1 ORDER BY id LIMIT $2))`

// CleanupByAge deletes the outbox rows older than retention, in batches of
// batch rows, each its own transaction, and returns how many it deleted:
// the retention of an outbox relayed from the WAL in plain-insert mode,
// whose rows keep dispatched_at NULL (ops.Cleanup deletes dispatched rows
// only). Do not run it on an outbox that a polling relay also serves: it
// deletes pending rows.
func CleanupByAge(ctx context.Context, db Querier, t outbox.Tables, retention time.Duration, batch int) (int64, error) {
	if retention <= 0 || batch <= 0 {
		return 0, fmt.Errorf("walrelay: cleanup needs a positive retention and batch (got %s, %d)", retention, batch)
	}
	sql := render(cleanupSQL, t)
	before := time.Now().Add(-retention)
	var total int64
	for {
		tag, err := db.Exec(ctx, sql, before, batch)
		if err != nil {
			return total, fmt.Errorf("walrelay: cleanup of %s: %w", t.WithDefaults().OutboxIdent(), err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}
