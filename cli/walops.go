package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/ops"
)

// walSlot finds the replication slot of an outbox relayed from the WAL:
// the one named by --slot (an error when it does not exist), else the WAL
// relay's default name. found is false for a polled outbox.
func walSlot(ctx context.Context, pool *pgxpool.Pool, t outbox.Tables, flag string) (ops.WALSlot, bool, error) {
	slot, err := ops.SlotName(ctx, pool, t, flag)
	if err != nil {
		return ops.WALSlot{}, false, err
	}
	s, found, err := ops.ReadWALSlot(ctx, pool, slot)
	if err != nil {
		return s, false, err
	}
	if !found && flag != "" {
		return s, false, fmt.Errorf("--slot %s: no replication slot of that name in this database (SELECT slot_name FROM pg_replication_slots lists them); leave --slot out for a polled outbox", flag)
	}
	return s, found, nil
}

func printWALStats(g *globals, t outbox.Tables, st ops.Stats) error {
	s := st.Slot
	w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "outbox\t%s\t(relayed from the WAL: rows are never marked dispatched)\n", t.OutboxIdent())
	fmt.Fprintf(w, "slot\t%s\n", s.Name)
	fmt.Fprintf(w, "slot lag\t%s\t(WAL since the position the broker acknowledged: %s)\n", fmtBytes(s.LagBytes), s.ConfirmedFlushLSN)
	fmt.Fprintf(w, "wal status\t%s\t%s\n", s.WALStatus, walStatusNote(s.WALStatus))
	fmt.Fprintf(w, "reader\t%s\n", fmtReader(s))
	fmt.Fprintf(w, "safe wal size\t%s\n", fmtSafeWAL(s))
	fmt.Fprintf(w, "oldest row\t%s\t(retention cleanup deletes rows the slot confirmed, after --retention)\n", fmtAge(st.OldestRowAge))
	fmt.Fprintf(w, "table size\t%s\t(with indexes and TOAST)\n", fmtBytes(st.TableBytes))
	fmt.Fprintf(w, "live / dead rows\t%d / %d\n", st.LiveRows, st.DeadRows)
	fmt.Fprintf(w, "last vacuum\t%s\n", fmtVacuum(st.LastVacuum, st.LastAutovacuum))
	printPartitionStatus(w, st.Partitions)
	return w.Flush()
}

// fmtSafeWAL says how much more WAL the server may write before the slot
// is lost. safe_wal_size is NULL both when max_slot_wal_keep_size is
// unlimited and when the slot is lost already: the setting tells them
// apart.
func fmtSafeWAL(s ops.WALSlot) string {
	keep := "max_slot_wal_keep_size = " + s.MaxSlotWALKeepSize
	switch {
	case s.WALStatus == "lost":
		return "none: the slot is lost (" + keep + ")"
	case s.SafeWALBytes != nil:
		return fmt.Sprintf("%s more WAL before the slot is lost (%s)", fmtBytes(*s.SafeWALBytes), keep)
	case s.MaxSlotWALKeepSize == "-1":
		return "unlimited (" + keep + ": the slot can fill the disk)"
	}
	return "unknown (" + keep + ")"
}

func walStatusNote(status string) string {
	switch status {
	case "lost":
		return "(invalidated: events after its position may be missing; see 'outbox watchdog')"
	case "unreserved":
		return "(past max_slot_wal_keep_size: lost at the next checkpoint unless the relay catches up)"
	case "extended":
		return "(beyond max_wal_size, within max_slot_wal_keep_size)"
	}
	return ""
}

func fmtReader(s ops.WALSlot) string {
	switch {
	case s.Active:
		return fmt.Sprintf("active (pid %d)", s.ActivePID)
	case s.InactiveSinceKnown && !s.InactiveSince.IsZero():
		return "INACTIVE since " + s.InactiveSince.UTC().Format("2006-01-02T15:04:05Z") + ": no relay reads the slot"
	}
	return "INACTIVE: no relay reads the slot (since when is unknown before PG 17)"
}

func walSlotJSON(s ops.WALSlot) map[string]any {
	return map[string]any{
		"name":                   s.Name,
		"lag_bytes":              s.LagBytes,
		"wal_status":             s.WALStatus,
		"active":                 s.Active,
		"active_pid":             s.ActivePID,
		"confirmed_flush_lsn":    s.ConfirmedFlushLSN,
		"safe_wal_size_bytes":    s.SafeWALBytes,
		"max_slot_wal_keep_size": s.MaxSlotWALKeepSize,
		"inactive_since":         timeOrNil(s.InactiveSince),
		"inactive_since_known":   s.InactiveSinceKnown,
	}
}

func walStatsJSON(t outbox.Tables, st ops.Stats) map[string]any {
	return map[string]any{
		"outbox":             t.OutboxIdent(),
		"mode":               "wal",
		"slot":               walSlotJSON(st.Slot),
		"oldest_row_seconds": st.OldestRowAge.Seconds(),
		"table_bytes":        st.TableBytes,
		"live_rows":          st.LiveRows,
		"dead_rows":          st.DeadRows,
		"last_vacuum":        timeOrNil(st.LastVacuum),
		"last_autovacuum":    timeOrNil(st.LastAutovacuum),
		"partitions":         partitionStatusJSON(st.Partitions),
	}
}

func walReportJSON(t outbox.Tables, rep ops.Report) map[string]any {
	problems := rep.Problems
	if problems == nil {
		problems = []string{}
	}
	return map[string]any{
		"outbox":               t.OutboxIdent(),
		"mode":                 "wal",
		"healthy":              rep.Healthy(),
		"slot":                 walSlotJSON(rep.Slot),
		"slot_missing":         rep.SlotMissing,
		"max_slot_lag_bytes":   rep.MaxSlotLagBytes,
		"max_inactive_seconds": rep.MaxInactive.Seconds(),
		"problems":             problems,
		"partitions":           partitionStatusJSON(rep.Partitions),
	}
}
