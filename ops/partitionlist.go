package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/durations"
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/migrate"
)

// PartitionInfo is one partition of a partitioned outbox, as `outbox
// partitions list` shows it: what retention would do with it, and why.
type PartitionInfo struct {
	PartitionRange
	// Rows is Postgres' estimate (-1 until first vacuumed or analyzed).
	Rows int64 `json:"rows_estimate"`
	// NewestCreatedAt is the created_at of its highest id; zero when it
	// holds no row.
	NewestCreatedAt time.Time `json:"newest_created_at"`
	// Pending rows (the polling source's), Held among them, and Parked
	// rows whose ids fall in it (unparking one puts it back here).
	Pending int64 `json:"pending"`
	Held    int64 `json:"held"`
	Parked  int64 `json:"parked"`
	// Open: ids are still drawn into it (the sequence has not passed its
	// end), or it is ahead of the sequence.
	Open bool `json:"open"`
	// DetachPending: a detach of it did not finish; the next cleanup
	// finishes it.
	DetachPending bool `json:"detach_pending"`
	// Droppable: retention would detach and drop it now (for the WAL
	// source, once the slot confirms the position after the detach).
	Droppable bool `json:"droppable"`
	// Why it is not droppable; empty when it is.
	Why string `json:"why,omitempty"`
	// Reason is Why as a code when it is a partition retention keeps
	// past its due (Kept*); empty otherwise.
	Reason string `json:"reason,omitempty"`
}

// Why a partition whose rows are all older than the retention is kept
// (KeptPartition.Reason; the outbox_partitions_kept gauge's label).
const (
	// KeptPending: it holds pending rows (polling source).
	KeptPending = "pending"
	// KeptHeld: it holds pending rows of which some are held after a
	// permanent failure.
	KeptHeld = "held"
	// KeptParked: rows parked from it would have no partition to be
	// unparked into.
	KeptParked = "parked"
	// KeptSlotBehind: the WAL source's slot did not confirm the position
	// after the partition's last transaction in time, or is missing, lost
	// or unreserved.
	KeptSlotBehind = "slot_behind"
	// KeptInFlight: rows became pending in it while it was being
	// detached (an insert in flight when it looked done, or a replay):
	// it was attached back.
	KeptInFlight = "in_flight"
)

// PartitionListConfig configures ListPartitions.
type PartitionListConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// Source relays the outbox: the WAL source's rows are never marked
	// dispatched, so their pending count says nothing. Defaults to
	// Polling.
	Source Source
	// Retention is the retention to judge the partitions by. Defaults to
	// DefaultRetention (7d).
	Retention time.Duration
}

// ListPartitions reads every partition of a partitioned outbox, what it
// holds and whether retention (with cfg.Retention) would drop it, and the
// headroom; ErrNotPartitioned for a plain outbox. It writes nothing.
func ListPartitions(ctx context.Context, db outbox.DB, cfg PartitionListConfig) ([]PartitionInfo, Headroom, error) {
	cfg.Tables = cfg.Tables.WithDefaults()
	durations.Fill([]durations.Default{{Name: "Retention", V: &cfg.Retention, Def: DefaultRetention}})
	if err := cfg.Tables.Validate(); err != nil {
		return nil, Headroom{}, err
	}
	settings, err := partitionSettings(ctx, db, cfg.Tables, cfg.Tables.Outbox)
	if err != nil {
		return nil, Headroom{}, err
	}
	h, parts, err := readHeadroom(ctx, db, cfg.Tables, cfg.Tables.Outbox, settings, false)
	if err != nil {
		return nil, h, err
	}
	var now time.Time
	if err := db.QueryRow(ctx, serverNowSQL).Scan(&now); err != nil {
		return nil, h, fmt.Errorf("ops: read server time: %w", err)
	}
	out := make([]PartitionInfo, 0, len(parts))
	for _, p := range parts {
		info, err := judgePartition(ctx, db, cfg.Tables, cfg.Source, p, h.NextID, now.Add(-cfg.Retention))
		if err != nil {
			return nil, h, err
		}
		out = append(out, info)
	}
	return out, h, nil
}

// judgePartition reads p's rows and says whether retention, with rows
// created before cutoff due, would drop it, and why not.
func judgePartition(ctx context.Context, db outbox.DB, t outbox.Tables, src Source, p partition.Partition, next int64, cutoff time.Time) (PartitionInfo, error) {
	info := PartitionInfo{PartitionRange: PartitionRange{Name: p.Name, From: p.From, To: p.To}, Rows: p.Rows, DetachPending: p.DetachPending}
	info.Open = p.To > next
	if p.DetachPending {
		// Queries of the outbox no longer see its rows.
		info.Why = "a detach of it did not finish; the next cleanup finishes it (or attaches it back)"
		return info, nil
	}
	var err error
	info.NewestCreatedAt, info.Pending, info.Held, info.Parked, err = readPartitionRows(ctx, db, t, p.From, p.To)
	if err != nil {
		return info, fmt.Errorf("ops: read partition %s of %s: %w", p.Name, t.OutboxIdent(), err)
	}
	if src.IsWAL() {
		info.Pending, info.Held = 0, 0
	}
	switch {
	case info.Open && p.From >= next:
		info.Why = "it is ahead of the id sequence"
	case info.Open:
		info.Why = "ids are still drawn into it"
	case !info.NewestCreatedAt.IsZero() && !info.NewestCreatedAt.Before(cutoff):
		info.Why = fmt.Sprintf("its newest row was created %s, within the retention", info.NewestCreatedAt.UTC().Format(time.RFC3339))
	case info.Held > 0:
		info.Why, info.Reason = fmt.Sprintf("%d pending rows, %d of them held after a permanent failure ('outbox watchdog', 'outbox events')", info.Pending, info.Held), KeptHeld
	case info.Pending > 0:
		info.Why, info.Reason = fmt.Sprintf("%d pending rows (is a relay running?)", info.Pending), KeptPending
	case info.Parked > 0:
		info.Why, info.Reason = fmt.Sprintf("%d parked rows would have no partition to be unparked into ('outbox events unpark', or delete them from the parked table)", info.Parked), KeptParked
	default:
		info.Droppable = true
	}
	return info, nil
}

// KeptPartition is a partition retention kept past its due, and why.
type KeptPartition struct {
	PartitionRange
	// Reason is a Kept* code; Detail says it in words.
	Reason string `json:"reason"`
	Detail string `json:"detail"`
}

// RetentionRun is the outcome of a partitioned outbox's last retention
// run, recorded in the database for every process to read.
type RetentionRun struct {
	At        time.Time        `json:"at"`
	Retention time.Duration    `json:"retention_ns"`
	Dropped   []PartitionRange `json:"dropped"`
	Kept      []KeptPartition  `json:"kept"`
}

// PartitionStatus is a partitioned outbox's partitions at a glance: for
// `outbox stats`, the watchdog and the metrics.
type PartitionStatus struct {
	Headroom Headroom
	// LastRetention is the last retention run's outcome; nil until one
	// ran.
	LastRetention *RetentionRun
}

// ReadPartitionStatus reads the headroom and the last retention run of a
// partitioned outbox; nil for a plain one. It writes nothing.
func ReadPartitionStatus(ctx context.Context, db outbox.DB, t outbox.Tables) (*PartitionStatus, error) {
	t = t.WithDefaults()
	p, err := migrate.ReadPartitioning(ctx, db, t)
	if err != nil || p.Layout != migrate.LayoutPartitioned {
		return nil, err
	}
	st := &PartitionStatus{}
	if st.Headroom, _, err = readHeadroom(ctx, db, t, t.Outbox, p.Settings, false); err != nil {
		return nil, err
	}
	var raw []byte
	if err := db.QueryRow(ctx, render(lastRetentionSQL, t)).Scan(&raw); err != nil {
		return nil, fmt.Errorf("ops: read the last retention run of %s: %w", t.OutboxIdent(), err)
	}
	if raw != nil {
		st.LastRetention = &RetentionRun{}
		if err := json.Unmarshal(raw, st.LastRetention); err != nil {
			return nil, fmt.Errorf("ops: read the last retention run of %s: %w", t.OutboxIdent(), err)
		}
	}
	return st, nil
}

// Problems says, one line each, what is unhealthy about the partitions:
// a low headroom, and partitions kept past their retention for any reason
// but parked rows (which an operator parked on purpose). Empty when
// healthy.
func (s *PartitionStatus) Problems() []string {
	if s == nil {
		return nil
	}
	var out []string
	if h := s.Headroom; h.Low {
		left := "no ids drawn in the last hour"
		if h.Rate > 0 {
			left = fmt.Sprintf("about %s at %.0f ids/s", h.Left.Round(time.Minute), h.Rate)
		}
		out = append(out, fmt.Sprintf("partition headroom is low: %d ids left before inserts fail (%s; kept at %d): is the relay's maintenance job or 'outbox partitions ensure' running as the table's owner? (a width of %d ids may also be too narrow for the rate)", h.IDs, left, h.Target, h.Width))
	}
	if r := s.LastRetention; r != nil {
		for _, k := range r.Kept {
			if k.Reason != KeptParked {
				out = append(out, fmt.Sprintf("partition %s (ids %d to %d) is past the retention but kept: %s", k.Name, k.From, k.To-1, k.Detail))
			}
		}
	}
	return out
}
