package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// An outbox relayed from the WAL (`outbox relay --mode wal`) never sets
// dispatched_at: its rows say nothing about what was published. What
// says it is the slot: its confirmed position is where the broker has
// acknowledged everything. The functions here read the slot instead of
// the rows, for the metrics, `outbox stats`, `outbox watchdog` and
// cleanup of such an outbox.

// DefaultMaxSlotLagBytes is the slot lag (WAL the server keeps for the
// slot) over which the WAL watchdog calls the outbox unhealthy: 1 GiB.
const DefaultMaxSlotLagBytes int64 = 1 << 30

// WALSlot is the state of an outbox's logical replication slot, as
// pg_replication_slots reports it.
type WALSlot struct {
	// Name of the slot.
	Name string
	// LagBytes is pg_current_wal_lsn() - confirmed_flush_lsn: WAL written
	// since the broker last acknowledged everything; the server keeps at
	// least this much on disk for the slot.
	LagBytes int64
	// WALStatus is reserved, extended, unreserved (past
	// max_slot_wal_keep_size: about to be lost) or lost (invalidated:
	// events after ConfirmedFlushLSN may be missing).
	WALStatus string
	// Active is true while a relayer streams from the slot; ActivePID is
	// its walsender's process id (0 when inactive).
	Active    bool
	ActivePID int32
	// ConfirmedFlushLSN is the position the relayer last acknowledged.
	ConfirmedFlushLSN string
	// SafeWALBytes is how much more WAL can be written before the slot is
	// lost (safe_wal_size); nil when max_slot_wal_keep_size is unlimited,
	// and when the slot is lost already.
	SafeWALBytes *int64
	// MaxSlotWALKeepSize is the server's max_slot_wal_keep_size as it
	// shows it ("16MB"; "-1" for unlimited).
	MaxSlotWALKeepSize string
	// InactiveSince is when the slot was last released (PG 17+:
	// inactive_since); zero while active. InactiveSinceKnown is false on
	// servers that do not report it (PG 16 and older): how long an
	// inactive slot has been so is unknown there.
	InactiveSince      time.Time
	InactiveSinceKnown bool
}

// SlotName is the slot of an outbox: slot when given, else the WAL
// relay's default for the session's database (walrelay.Names: the
// default of earlier versions when the outbox's slot has that name).
func SlotName(ctx context.Context, db outbox.DB, t outbox.Tables, slot string) (string, error) {
	s, _, _, err := walrelay.Names(ctx, db, t, slot, slot)
	return s, err
}

// ReadWALSlot reads the slot; found is false when this database has no
// slot of that name, which is how the operations commands tell a polled
// outbox from one relayed from the WAL.
func ReadWALSlot(ctx context.Context, db outbox.DB, slot string) (s WALSlot, found bool, err error) {
	s.Name = slot
	var inactive *time.Time
	err = db.QueryRow(ctx, walSlotSQL, slot).Scan(&s.LagBytes, &s.WALStatus, &s.Active, &s.ActivePID,
		&s.ConfirmedFlushLSN, &s.SafeWALBytes, &inactive, &s.InactiveSinceKnown, &s.MaxSlotWALKeepSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("ops: read replication slot %s: %w", slot, err)
	}
	if inactive != nil {
		s.InactiveSince = *inactive
	}
	return s, true, nil
}

// checkWAL is Check of the WAL source, cfg with its defaults.
func checkWAL(ctx context.Context, db outbox.DB, cfg WatchdogConfig) (Report, error) {
	slot := cfg.Source.Slot()
	rep := Report{Source: cfg.Source, MaxSlotLagBytes: cfg.MaxSlotLagBytes, MaxInactive: cfg.MaxInactive}
	s, found, err := ReadWALSlot(ctx, db, slot)
	if err != nil {
		return rep, err
	}
	rep.Slot = s
	if !found {
		rep.SlotMissing = true
		rep.Problems = append(rep.Problems, fmt.Sprintf("replication slot %s does not exist in this database: a WAL relay creates it at start; if one ran, the slot was dropped or lost in a failover and events committed since may be missing (republish them from the table with outbox relay --mode poll)", slot))
		return rep, nil
	}
	switch s.WALStatus {
	case "lost":
		rep.Problems = append(rep.Problems, fmt.Sprintf("slot %s is lost (wal_status=lost): the WAL it needed is gone and events after %s may be missing; drop it (outbox relay --mode wal --teardown) and republish the gap from the table (outbox relay --mode poll)", s.Name, s.ConfirmedFlushLSN))
	case "unreserved":
		rep.Problems = append(rep.Problems, fmt.Sprintf("slot %s is past max_slot_wal_keep_size (wal_status=unreserved) and will be lost at the next checkpoint unless its relay catches up", s.Name))
	}
	if s.LagBytes > cfg.MaxSlotLagBytes {
		rep.Problems = append(rep.Problems, fmt.Sprintf("slot %s is %d bytes behind (over %d): is a relay leading and reaching the broker? (its logs, /readyz)", s.Name, s.LagBytes, cfg.MaxSlotLagBytes))
	}
	if !s.Active && s.InactiveSinceKnown && !s.InactiveSince.IsZero() {
		var now time.Time
		if err := db.QueryRow(ctx, serverNowSQL).Scan(&now); err != nil {
			return rep, fmt.Errorf("ops: read server time: %w", err)
		}
		if d := now.Sub(s.InactiveSince); d > cfg.MaxInactive {
			rep.Problems = append(rep.Problems, fmt.Sprintf("slot %s has had no reader for %s (over %s): no WAL relay is running", s.Name, d.Round(time.Second), cfg.MaxInactive))
		}
	}
	return rep, nil
}

// readWALStats is ReadStats of the WAL source: the slot (which must
// exist) and the table.
func readWALStats(ctx context.Context, db outbox.DB, tables outbox.Tables, src Source) (Stats, error) {
	st := Stats{Source: src}
	slot := src.Slot()
	s, found, err := ReadWALSlot(ctx, db, slot)
	if err != nil {
		return st, err
	}
	if !found {
		return st, fmt.Errorf("ops: no replication slot %s in this database: start a relay with --mode wal (it creates it), or name the slot with --slot", slot)
	}
	st.Slot = s
	var age float64
	if err := db.QueryRow(ctx, render(oldestRowSQL, tables)).Scan(&age); err != nil {
		return st, fmt.Errorf("ops: read the oldest row of %s: %w", tables.OutboxIdent(), err)
	}
	st.OldestRowAge = seconds(age)
	st.Table, err = readTable(ctx, db, tables)
	return st, err
}

func readTable(ctx context.Context, db outbox.DB, tables outbox.Tables) (Table, error) {
	var t Table
	var lastVacuum, lastAuto *time.Time
	if err := db.QueryRow(ctx, tableSQL, tables.OutboxIdent()).Scan(&t.TableBytes, &t.LiveRows, &t.DeadRows, &lastVacuum, &lastAuto); err != nil {
		return t, fmt.Errorf("ops: read table statistics of %s: %w", tables.OutboxIdent(), err)
	}
	if lastVacuum != nil {
		t.LastVacuum = *lastVacuum
	}
	if lastAuto != nil {
		t.LastAutovacuum = *lastAuto
	}
	return t, nil
}
