package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/migrate"
)

// Queryer is what the read-only queries here need; *pgxpool.Pool, *pgx.Conn
// and pgx.Tx have it.
type Queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// DefaultStuckAfter is how long a row may stay pending before the watchdog
// calls it stuck.
const DefaultStuckAfter = 5 * time.Minute

// Lag is the state of the pending rows of one outbox table.
type Lag struct {
	// Pending rows are committed and not yet dispatched.
	Pending int64
	// Stuck rows have been pending longer than the StuckAfter they were
	// read with, or cannot move until someone acts: held rows and the rows
	// of their aggregates behind them count as stuck at once.
	Stuck int64
	// OldestPendingAge is how long the longest-waiting pending row has
	// waited: now() - created_at, or - requeued_at for a row an operator
	// put back (replay, unpark). The dispatch lag. Zero when nothing is
	// pending.
	OldestPendingAge time.Duration
	// Held counts pending rows whose last attempt failed for good (the
	// broker refused them, or the relayer could not decode them): each holds
	// up the rest of its aggregate until it is retried successfully or
	// parked. HeldByReason splits them by reason code (relay.Reason*).
	Held         int64
	HeldByReason map[string]int64
	// OldestHeldAge is how long the longest-held row has been failing
	// (since its first recorded failure). Zero when nothing is held.
	OldestHeldAge time.Duration
}

// heldRowsSQL is what makes a pending row held: a failures row (one per
// event, primary key event_id) recorded since the row last became pending.
// A failure older than that belongs to an earlier life of the row, before
// `outbox events replay` or `unpark` requeued it. The failures table is
// tiny and each of its rows finds its outbox row by primary key.
const heldRowsSQL = `SELECT f.event_id, o.aggregate_id, f.reason, f.first_failed_at FROM {{failures}} f JOIN {{outbox}} o ON o.id = f.event_id
  WHERE o.dispatched_at IS NULL AND f.failed_at >= coalesce(o.requeued_at, o.created_at)`

// lagSQL reads only pending rows, through the partial index (id) WHERE
// dispatched_at IS NULL: its cost follows the backlog, not the table, so it
// is cheap enough to run every few seconds. min(created_at), not the
// created_at of the lowest id: ids are taken at insert and created_at at
// transaction start, so a long transaction can hold an older row at a
// higher id. A requeued row counts from its requeued_at. Held rows, and the rows of their aggregates (all behind
// them: a held row is its aggregate's oldest pending row), are stuck at
// once, whatever their age. $1 is StuckAfter in microseconds.
const lagSQL = `WITH held AS MATERIALIZED (SELECT coalesce(array_agg(aggregate_id), '{}') AS aggs FROM (` + heldRowsSQL + `) h)
SELECT
  count(*),
  count(*) FILTER (WHERE coalesce(requeued_at, created_at) < now() - $1::bigint * interval '1 microsecond' OR aggregate_id = ANY((SELECT aggs FROM held)::uuid[])),
  coalesce(extract(epoch FROM now() - min(coalesce(requeued_at, created_at))), 0)::float8
FROM {{outbox}} WHERE dispatched_at IS NULL`

// heldSQL counts held rows by reason, with the oldest first failure.
const heldSQL = `SELECT reason, count(*), extract(epoch FROM now() - min(first_failed_at))::float8
FROM (` + heldRowsSQL + `) h GROUP BY reason`

// ReadLag reads the pending, stuck, held and lag figures: the queries
// behind the relay's gauges and the watchdog's SLO check.
func ReadLag(ctx context.Context, db Queryer, tables outbox.Tables, stuckAfter time.Duration) (Lag, error) {
	var l Lag
	var ageSec float64
	err := db.QueryRow(ctx, render(lagSQL, tables), stuckAfter.Microseconds()).Scan(&l.Pending, &l.Stuck, &ageSec)
	if err != nil {
		return l, fmt.Errorf("ops: read pending rows of %s: %w", tables.OutboxIdent(), err)
	}
	l.OldestPendingAge = seconds(ageSec)
	rows, err := db.Query(ctx, render(heldSQL, tables))
	if err != nil {
		return l, fmt.Errorf("ops: read held rows of %s: %w", tables.OutboxIdent(), err)
	}
	var (
		reason string
		n      int64
		oldest float64
	)
	l.HeldByReason = map[string]int64{}
	_, err = pgx.ForEachRow(rows, []any{&reason, &n, &oldest}, func() error {
		l.Held += n
		l.HeldByReason[reason] = n
		l.OldestHeldAge = max(l.OldestHeldAge, seconds(oldest))
		return nil
	})
	if err != nil {
		return l, fmt.Errorf("ops: read held rows of %s: %w", tables.OutboxIdent(), err)
	}
	return l, nil
}

// Stats is a snapshot of one outbox table, for `outbox stats`.
type Stats struct {
	Lag
	// StuckAfter is the threshold Lag.Stuck was counted with.
	StuckAfter time.Duration
	// DispatchedLastMinute and DispatchedLastHour count rows dispatched in
	// those windows, among the rows created in the last RateWindow (there is
	// no index on dispatched_at, so the count walks the primary key over
	// recent rows only). A backlog older than that drains uncounted: the
	// relay's outbox_events_dispatched_total counter is exact.
	DispatchedLastMinute, DispatchedLastHour int64
	// TableBytes is the outbox table's size with its indexes and TOAST.
	TableBytes int64
	// LiveRows and DeadRows are the statistics collector's estimates. Many
	// dead rows mean vacuum lags behind the relay's updates and cleanup's
	// deletes: the table and its indexes bloat.
	LiveRows, DeadRows int64
	// LastVacuum and LastAutovacuum are zero when the table was never
	// vacuumed (since the statistics were reset).
	LastVacuum, LastAutovacuum time.Time
}

// RateWindow bounds the rows the dispatch counts of Stats look at: rows
// created in the last hour plus ten minutes of slack for lag.
const RateWindow = 70 * time.Minute

// rateSQL counts recent dispatches over a primary-key range starting at the
// first row created within RateWindow. $1 first id, $2 the server's now().
const rateSQL = `SELECT
  count(*) FILTER (WHERE dispatched_at > $2::timestamptz - interval '1 minute'),
  count(*) FILTER (WHERE dispatched_at > $2::timestamptz - interval '1 hour')
FROM {{outbox}} WHERE id >= $1`

// tableSQL reads size and tuple counts; $1 is the quoted table name.
const tableSQL = `SELECT pg_total_relation_size(c.oid), coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
  s.last_vacuum, s.last_autovacuum
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = $1::regclass`

// ReadStats reads the snapshot. It runs a handful of short queries, none of
// which scans the whole table.
func ReadStats(ctx context.Context, db Queryer, tables outbox.Tables, stuckAfter time.Duration) (Stats, error) {
	s := Stats{StuckAfter: stuckAfter}
	var err error
	if s.Lag, err = ReadLag(ctx, db, tables, stuckAfter); err != nil {
		return s, err
	}
	wrap := func(what string, err error) error {
		return fmt.Errorf("ops: read %s of %s: %w", what, tables.OutboxIdent(), err)
	}
	var now time.Time
	if err := db.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return s, wrap("server time", err)
	}
	first, err := firstIDCreatedSince(ctx, db, tables, now.Add(-RateWindow))
	if err != nil {
		return s, wrap("dispatch rate", err)
	}
	if err := db.QueryRow(ctx, render(rateSQL, tables), first, now).Scan(&s.DispatchedLastMinute, &s.DispatchedLastHour); err != nil {
		return s, wrap("dispatch rate", err)
	}
	var lastVacuum, lastAuto *time.Time
	if err := db.QueryRow(ctx, tableSQL, tables.OutboxIdent()).Scan(&s.TableBytes, &s.LiveRows, &s.DeadRows, &lastVacuum, &lastAuto); err != nil {
		return s, wrap("table statistics", err)
	}
	if lastVacuum != nil {
		s.LastVacuum = *lastVacuum
	}
	if lastAuto != nil {
		s.LastAutovacuum = *lastAuto
	}
	return s, nil
}

// firstIDCreatedSince finds, by binary search over the primary key, the
// first id whose row was created at or after since; one past the last id
// when there is none. There is no index on created_at, but ids and
// created_at rise together (up to the length of the inserting
// transactions), so a few dozen single-row index probes find the boundary
// that a full scan would. Rows out of step with their ids by more than the
// callers' slack may land on the wrong side; callers use the result only
// to bound a scan.
func firstIDCreatedSince(ctx context.Context, db Queryer, tables outbox.Tables, since time.Time) (int64, error) {
	var lo, hi *int64
	if err := db.QueryRow(ctx, render(`SELECT min(id), max(id) FROM {{outbox}}`, tables)).Scan(&lo, &hi); err != nil {
		return 0, err
	}
	if lo == nil {
		return 0, nil
	}
	probe := render(`SELECT id, created_at FROM {{outbox}} WHERE id >= $1 ORDER BY id LIMIT 1`, tables)
	a, b := *lo, *hi+1
	for a < b {
		mid := a + (b-a)/2
		var id int64
		var created time.Time
		err := db.QueryRow(ctx, probe, mid).Scan(&id, &created)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			b = mid
		case err != nil:
			return 0, err
		case created.Before(since):
			a = id + 1
		default:
			b = mid
		}
	}
	// a > b only if rows vanished under the search; the lower is the
	// conservative bound.
	return min(a, b), nil
}

func render(sql string, tables outbox.Tables) string {
	return strings.NewReplacer(
		"{{outbox}}", tables.OutboxIdent(),
		"{{processed}}", tables.ProcessedIdent(),
		"{{failures}}", migrate.FailuresIdent(tables),
	).Replace(sql)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
