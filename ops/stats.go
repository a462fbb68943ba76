package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/durations"
)

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

// ReadLag reads the pending, stuck, held and lag figures: the queries
// behind the relay's gauges and the watchdog's SLO check.
func ReadLag(ctx context.Context, db outbox.DB, tables outbox.Tables, stuckAfter time.Duration) (Lag, error) {
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

// StatsConfig configures ReadStats.
type StatsConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// Source relays the outbox: the polling source's figures are its
	// pending rows, the WAL source's its slot (which must exist; see
	// ReadWALSlot). Defaults to Polling.
	Source Source
	// StuckAfter (polling source): rows pending longer are counted stuck.
	// Defaults to DefaultStuckAfter (5m).
	StuckAfter time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c StatsConfig) WithDefaults() StatsConfig {
	c.Tables = c.Tables.WithDefaults()
	durations.Fill(c.durations())
	return c
}

func (c *StatsConfig) durations() []durations.Default {
	return []durations.Default{{Name: "StuckAfter", V: &c.StuckAfter, Def: DefaultStuckAfter}}
}

// Validate reports a bad table name or a negative StuckAfter.
func (c StatsConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	return durations.Check("stats", c.durations())
}

// Stats is a snapshot of one outbox table, for `outbox stats`.
type Stats struct {
	// Source is the configuration's: it says which of the fields below
	// were read.
	Source Source

	// The polling source's pending rows.
	Lag
	// StuckAfter is the threshold Lag.Stuck was counted with.
	StuckAfter time.Duration
	// DispatchedLastMinute and DispatchedLastHour count rows dispatched in
	// those windows, among the rows created in the last RateWindow (there is
	// no index on dispatched_at, so the count walks the primary key over
	// recent rows only). A backlog older than that drains uncounted: the
	// relay's outbox_events_dispatched_total counter is exact.
	DispatchedLastMinute, DispatchedLastHour int64

	// The WAL source's slot, which stands for the rows that are never
	// marked dispatched.
	Slot WALSlot
	// OldestRowAge (WAL source) is the age of the row with the lowest id:
	// how far back retention cleanup has left the table. Zero when it is
	// empty.
	OldestRowAge time.Duration

	// Table is the table's size and vacuum state, for both sources (of
	// every partition, for a partitioned outbox).
	Table

	// Partitions is a partitioned outbox's headroom and last retention
	// run, for both sources; nil for a plain outbox.
	Partitions *PartitionStatus
}

// Table is an outbox table's size and vacuum state.
type Table struct {
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

// ReadStats reads the snapshot. It runs a handful of short queries, none of
// which scans the whole table.
func ReadStats(ctx context.Context, db outbox.DB, cfg StatsConfig) (Stats, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Stats{}, err
	}
	tables := cfg.Tables
	var s Stats
	var err error
	if cfg.Source.IsWAL() {
		s, err = readWALStats(ctx, db, tables, cfg.Source)
	} else {
		s, err = readPollingStats(ctx, db, cfg)
	}
	if err != nil {
		return s, err
	}
	s.Partitions, err = ReadPartitionStatus(ctx, db, tables)
	return s, err
}

// readPollingStats is ReadStats of the polling source, cfg with its
// defaults.
func readPollingStats(ctx context.Context, db outbox.DB, cfg StatsConfig) (Stats, error) {
	tables := cfg.Tables
	s := Stats{Source: cfg.Source, StuckAfter: cfg.StuckAfter}
	var err error
	if s.Lag, err = ReadLag(ctx, db, tables, cfg.StuckAfter); err != nil {
		return s, err
	}
	wrap := func(what string, err error) error {
		return fmt.Errorf("ops: read %s of %s: %w", what, tables.OutboxIdent(), err)
	}
	var now time.Time
	if err := db.QueryRow(ctx, serverNowSQL).Scan(&now); err != nil {
		return s, wrap("server time", err)
	}
	first, err := firstIDCreatedSince(ctx, db, tables, now.Add(-RateWindow))
	if err != nil {
		return s, wrap("dispatch rate", err)
	}
	if err := db.QueryRow(ctx, render(rateSQL, tables), first, now).Scan(&s.DispatchedLastMinute, &s.DispatchedLastHour); err != nil {
		return s, wrap("dispatch rate", err)
	}
	s.Table, err = readTable(ctx, db, tables)
	return s, err
}

// firstIDCreatedSince finds, by binary search over the primary key, the
// first id whose row was created at or after since; one past the last id
// when there is none. There is no index on created_at, but ids and
// created_at rise together (up to the length of the inserting
// transactions), so a few dozen single-row index probes find the boundary
// that a full scan would. Rows out of step with their ids by more than the
// callers' slack may land on the wrong side; callers use the result only
// to bound a scan.
func firstIDCreatedSince(ctx context.Context, db outbox.DB, tables outbox.Tables, since time.Time) (int64, error) {
	var lo, hi *int64
	if err := db.QueryRow(ctx, render(idRangeSQL, tables)).Scan(&lo, &hi); err != nil {
		return 0, err
	}
	if lo == nil {
		return 0, nil
	}
	probe := render(idProbeSQL, tables)
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

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
