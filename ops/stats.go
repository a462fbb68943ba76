// Package ops holds the operational queries shared by the CLI and the
// relay: outbox statistics, and (as they land) the watchdog, lag and cleanup.
package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// Queryer is what the queries here need; *pgxpool.Pool and pgx.Tx have it.
type Queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Stats is a snapshot of one outbox table.
type Stats struct {
	// Pending rows are committed and not yet dispatched.
	Pending int64 `json:"pending"`
	// OldestPendingAge is now() - created_at of the oldest pending row: the
	// dispatch lag. Zero when nothing is pending.
	OldestPendingAge time.Duration `json:"oldest_pending_age_ns"`
	// DispatchedLastMinute counts rows dispatched in the last minute.
	DispatchedLastMinute int64 `json:"dispatched_last_minute"`
}

// pending and oldest come from the pending index (id) WHERE dispatched_at IS
// NULL; the dispatched count scans recent rows from the end of the primary
// key, stopping at rows created more than a minute before... it cannot know
// where to stop, so it is bounded by created_at instead, which is close
// enough (rows are dispatched seconds after creation) and needs no index on
// dispatched_at.
const statsSQL = `SELECT
  (SELECT count(*) FROM %[1]s WHERE dispatched_at IS NULL),
  coalesce((SELECT extract(epoch FROM now() - created_at) FROM %[1]s WHERE dispatched_at IS NULL ORDER BY id LIMIT 1), 0),
  (SELECT count(*) FROM %[1]s WHERE created_at > now() - interval '10 minutes' AND dispatched_at > now() - interval '1 minute')`

// ReadStats reads the snapshot.
func ReadStats(ctx context.Context, db Queryer, tables outbox.Tables) (Stats, error) {
	var s Stats
	var ageSec float64
	err := db.QueryRow(ctx, fmt.Sprintf(statsSQL, tables.OutboxIdent())).Scan(&s.Pending, &ageSec, &s.DispatchedLastMinute)
	if err != nil {
		return s, fmt.Errorf("read stats of %s: %w", tables.OutboxIdent(), err)
	}
	s.OldestPendingAge = time.Duration(ageSec * float64(time.Second))
	return s, nil
}
