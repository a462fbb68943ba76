package outbox

import (
	"fmt"
	"strings"
)

// Mode is how a Producer writes an event (Config.Mode). ModeInsert works
// with both relay sources; the other two leave no row for the polling
// relay to read and are published only by the WAL source (`outbox relay
// --mode wal`, package relay/walrelay), which reads them from the
// write-ahead log. BENCHMARKS.md ("wal") measures what each costs the
// business transactions.
//
// Use a WAL-only mode only once the outbox's replication slot exists
// (`outbox switch to-wal`, or `outbox relay --mode wal --setup-only`) on
// a server with wal_level=logical: an event written before is in no slot
// and has no row, so it is lost, and its commit reports no error.
type Mode int

const (
	// ModeInsert inserts a row into the outbox table. The polling relay
	// claims it and sets dispatched_at; the WAL source reads the insert
	// from the log and never updates the row, which cleanup deletes once
	// the slot has confirmed it. Plain-SQL producers (INSERT, or the
	// <outbox>_emit function) write the same rows.
	ModeInsert Mode = iota
	// ModeInsertDelete inserts the row and deletes it again in the same
	// transaction, as Debezium's outbox router recommends: the WAL source
	// publishes the insert, and the table stays empty, so there is
	// nothing for cleanup to delete and only the dead tuples of the
	// deletes for vacuum. It costs a second statement (pipelined with the
	// insert by Emit and QueueEmit, a second round trip for EmitBatch and
	// the database/sql functions).
	ModeInsertDelete
	// ModeMessage writes no row: each event is a transactional logical
	// decoding message (pg_logical_emit_message(true, ...), prefix
	// Tables.MessagePrefix) that exists iff the transaction commits,
	// written by the outbox's <outbox>_emit_message function (migration
	// 7), which draws its id from the outbox's id sequence, so it is
	// unique among rows' ids too and never the producer's choice. No
	// table, index or vacuum is involved: only WAL. The producers' role
	// needs EXECUTE on that function only. The WAL source publishes them
	// only with message-mode events on (`outbox relay --mode wal
	// --messages`, walrelay.Config.Messages), which takes
	// pg_logical_emit_message revoked from PUBLIC, per database, and from
	// every role but superusers, the relay's and the function's owner
	// (any of them could write events with ids of their choosing).
	ModeMessage
)

// String is the mode's name, as ParseMode reads it.
func (m Mode) String() string {
	switch m {
	case ModeInsert:
		return "insert"
	case ModeInsertDelete:
		return "insert-delete"
	case ModeMessage:
		return "message"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// WALOnly reports whether only the WAL source publishes the events of m.
func (m Mode) WALOnly() bool { return m == ModeInsertDelete || m == ModeMessage }

// ParseMode reads a mode's name: insert, insert-delete or message.
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{ModeInsert, ModeInsertDelete, ModeMessage} {
		if strings.EqualFold(s, m.String()) {
			return m, nil
		}
	}
	return 0, fmt.Errorf("outbox: unknown emit mode %q; use insert, insert-delete or message", s)
}
