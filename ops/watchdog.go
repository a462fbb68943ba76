package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// Watchdog defaults.
const (
	// DefaultMaxLag is the lag SLO: the oldest pending row should be
	// younger than this. A healthy relay keeps it under a second.
	DefaultMaxLag = 5 * time.Second
	// DefaultStuckLimit is how many stuck rows a report lists.
	DefaultStuckLimit = 100
)

// WatchdogConfig configures Check.
type WatchdogConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// Source relays the outbox: the polling relay's pending rows are
	// checked against StuckAfter, MaxLag and Limit, the WAL source's slot
	// against MaxSlotLagBytes and MaxInactive. Defaults to Polling.
	Source Source
	// StuckAfter: rows pending longer are stuck. Defaults to
	// DefaultStuckAfter (5m).
	StuckAfter time.Duration
	// MaxLag is the lag SLO. Defaults to DefaultMaxLag (5s).
	MaxLag time.Duration
	// Limit caps the stuck rows listed (all are counted). Defaults to
	// DefaultStuckLimit.
	Limit int
	// MaxSlotLagBytes (WAL source): a slot further behind is unhealthy.
	// Defaults to DefaultMaxSlotLagBytes (1 GiB).
	MaxSlotLagBytes int64
	// MaxInactive (WAL source): a slot nobody has read for longer is
	// unhealthy, on servers that say since when (PG 17+). Defaults to
	// DefaultStuckAfter (5m).
	MaxInactive time.Duration
}

// Validate reports a bad table name or a negative threshold.
func (c WatchdogConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	if c.StuckAfter < 0 || c.MaxLag < 0 || c.Limit < 0 {
		return fmt.Errorf("ops: watchdog StuckAfter (%s), MaxLag (%s) and Limit (%d) must not be negative; 0 means the default", c.StuckAfter, c.MaxLag, c.Limit)
	}
	if c.MaxSlotLagBytes < 0 || c.MaxInactive < 0 {
		return fmt.Errorf("ops: watchdog MaxSlotLagBytes (%d) and MaxInactive (%s) must not be negative; 0 means the default", c.MaxSlotLagBytes, c.MaxInactive)
	}
	return nil
}

// WithDefaults returns c with each zero field set to its default.
func (c WatchdogConfig) WithDefaults() WatchdogConfig {
	c.Tables = c.Tables.WithDefaults()
	if c.StuckAfter == 0 {
		c.StuckAfter = DefaultStuckAfter
	}
	if c.MaxLag == 0 {
		c.MaxLag = DefaultMaxLag
	}
	if c.Limit == 0 {
		c.Limit = DefaultStuckLimit
	}
	if c.MaxSlotLagBytes == 0 {
		c.MaxSlotLagBytes = DefaultMaxSlotLagBytes
	}
	if c.MaxInactive == 0 {
		c.MaxInactive = DefaultStuckAfter
	}
	return c
}

// StuckRow is a row pending longer than the watchdog's StuckAfter, or held
// after a permanent failure, or waiting behind a held row.
type StuckRow struct {
	ID          int64
	AggregateID uuid.UUID
	Type        string
	CreatedAt   time.Time
	Age         time.Duration
	// BlockedBy is the oldest pending row of the same aggregate when that
	// is another row: this one waits behind it to keep the aggregate's
	// order, and the cause is there. Zero when this row is the head.
	BlockedBy int64
	// Reason and LastError are the permanent failure a relayer recorded
	// for this row (it is held), with its time, the number of failed
	// attempts recorded and when it is tried again (zero once an operator
	// lifted the hold). Empty when none is known: this row waits behind
	// BlockedBy, or no relayer tried it (is one running?), or its failures
	// were transient (broker or network; see the relay's logs and
	// outbox_publish_errors_total).
	Reason, LastError string
	Attempts          int
	FailedAt          time.Time
	HeldUntil         time.Time
}

// Report is what the watchdog found.
type Report struct {
	// Source is the configuration's: it says which of the fields below
	// were read.
	Source Source

	// The polling source's pending rows.
	Lag
	StuckAfter, MaxLag time.Duration
	// LagBreached: the oldest pending row is older than MaxLag.
	LagBreached bool
	// Stuck lists the first Limit stuck rows in id order; Lag.Stuck counts
	// them all.
	Stuck []StuckRow

	// The WAL source's slot.
	Slot            WALSlot
	MaxSlotLagBytes int64
	MaxInactive     time.Duration
	// SlotMissing: no such slot in this database (dropped, or a failover
	// to a server without it: events committed since may never be
	// relayed).
	SlotMissing bool
	// Problems says, one line each, what is unhealthy about the slot;
	// empty when healthy.
	Problems []string

	// Partitions is a partitioned outbox's headroom and last retention
	// run, for either source (nil for a plain outbox): its Problems (a
	// low headroom, partitions kept past the retention) make the report
	// unhealthy.
	Partitions *PartitionStatus
}

// Healthy reports whether the outbox is healthy: for the polling source,
// nothing is stuck and the lag is within the SLO; for the WAL source, the
// slot has no problem.
func (r Report) Healthy() bool {
	if len(r.Partitions.Problems()) > 0 {
		return false
	}
	if r.Source.IsWAL() {
		return len(r.Problems) == 0
	}
	return r.Lag.Stuck == 0 && !r.LagBreached
}

// Check runs the watchdog once. For the polling source it counts pending
// and stuck rows, checks the lag SLO and lists stuck rows with what is
// known about them. For the WAL source the slot must exist, be within
// MaxSlotLagBytes, not be lost or unreserved, and (PG 17+) not be inactive
// longer than MaxInactive. A partitioned outbox's partitions must reach
// far enough past the id sequence, and its last retention run must have
// kept none past the retention (but for parked rows).
func Check(ctx context.Context, db outbox.DB, cfg WatchdogConfig) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	cfg = cfg.WithDefaults()
	var rep Report
	var err error
	if cfg.Source.IsWAL() {
		rep, err = checkWAL(ctx, db, cfg)
	} else {
		rep, err = checkPolling(ctx, db, cfg)
	}
	if err != nil {
		return rep, err
	}
	rep.Partitions, err = ReadPartitionStatus(ctx, db, cfg.Tables)
	return rep, err
}

// checkPolling is Check of the polling source, cfg with its defaults.
func checkPolling(ctx context.Context, db outbox.DB, cfg WatchdogConfig) (Report, error) {
	rep := Report{Source: cfg.Source, StuckAfter: cfg.StuckAfter, MaxLag: cfg.MaxLag}
	var err error
	if rep.Lag, err = ReadLag(ctx, db, cfg.Tables, cfg.StuckAfter); err != nil {
		return rep, err
	}
	rep.LagBreached = rep.OldestPendingAge > cfg.MaxLag
	if rep.Lag.Stuck == 0 {
		return rep, nil
	}
	rows, err := db.Query(ctx, render(stuckSQL, cfg.Tables), cfg.StuckAfter.Microseconds(), cfg.Limit)
	if err != nil {
		return rep, fmt.Errorf("ops: list stuck rows of %s: %w", cfg.Tables.OutboxIdent(), err)
	}
	rep.Stuck, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StuckRow, error) {
		var s StuckRow
		var age float64
		var head int64
		var reason, lastErr *string
		var attempts *int
		var failedAt, heldUntil *time.Time
		if err := r.Scan(&s.ID, &s.AggregateID, &s.Type, &s.CreatedAt, &age, &head, &reason, &lastErr, &attempts, &failedAt, &heldUntil); err != nil {
			return s, err
		}
		s.Age = seconds(age)
		if head != s.ID {
			s.BlockedBy = head
		}
		if lastErr != nil {
			s.Reason, s.LastError, s.Attempts, s.FailedAt = *reason, *lastErr, *attempts, *failedAt
			if heldUntil != nil {
				s.HeldUntil = *heldUntil
			}
		}
		return s, nil
	})
	if err != nil {
		return rep, fmt.Errorf("ops: list stuck rows of %s: %w", cfg.Tables.OutboxIdent(), err)
	}
	return rep, nil
}
