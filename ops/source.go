package ops

import "fmt"

// Source says which relay source moves an outbox's rows to the broker,
// which decides what the figures, the watchdog and cleanup read: the
// polling relay marks rows dispatched, so they read the pending rows; the
// WAL source (package relay/walrelay) never does, so they read its
// replication slot. The zero value is the polling source.
//
//	rep, err := ops.Check(ctx, pool, ops.WatchdogConfig{Tables: tables, Source: ops.WAL(slot)})
type Source struct {
	slot string
}

// Polling is the polling relay (package relay), the zero Source.
var Polling = Source{}

// WAL is the WAL source reading the replication slot slot (see SlotName
// for an outbox's default).
func WAL(slot string) Source { return Source{slot: slot} }

// IsWAL reports whether the outbox is relayed from the WAL.
func (s Source) IsWAL() bool { return s.slot != "" }

// Slot is the WAL source's replication slot; empty for the polling source.
func (s Source) Slot() string { return s.slot }

// String is "polling" or "wal (slot NAME)".
func (s Source) String() string {
	if s.IsWAL() {
		return fmt.Sprintf("wal (slot %s)", s.slot)
	}
	return "polling"
}
