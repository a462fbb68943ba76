// Package sqltext renders the SQL statements of every package for one
// outbox's tables. Statements are constants (or embedded .sql files) that
// name tables and indexes by placeholder, {{outbox}}, {{failures}} and so
// on; Render fills them with quoted identifiers, once, when the component
// that runs them is built. Identifiers come only from For, which quotes the
// names outbox.Tables has validated: nothing from configuration is spliced
// into SQL raw.
//
// Each package lists its statements with Register, so that one test
// (plan_test.go here) renders every statement of every package and
// EXPLAINs it against a migrated schema.
package sqltext

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/pgoutbox/outbox/internal/lockkey"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// Idents are the quoted identifiers statements refer to, for one outbox.
type Idents struct {
	Schema    string // {{schema}}
	Outbox    string // {{outbox}}: the outbox table
	Processed string // {{processed}}: the consumers' dedupe table
	Failures  string // {{failures}}: permanent publish failures and holds (migration 2)
	Parked    string // {{parked}}: rows `outbox events park` took out (migration 4)
	// Migrations is the bookkeeping table of applied versions.
	Migrations string // {{migrations}}
	// Index names, for the migrations that create and drop them.
	PendingIdx     string // {{pending_idx}}: (id) WHERE dispatched_at IS NULL
	AggregateIdx   string // {{aggregate_idx}}: dropped by migration 3
	ProcessedAtIdx string // {{processed_at_idx}}
	// The SQL emit function (migration 5) and what it shares with Emit.
	EmitFn     string // {{emit_fn}}: <schema>.<outbox>_emit
	EmitLockNS string // {{emit_lock_ns}}: Emit's advisory-lock namespace, an int4 literal
	Channel    string // {{channel}}: the NOTIFY channel, a string literal
	// The insert-time guard (migration 6): a trigger and its function,
	// both named <outbox>_guard.
	GuardFn      string // {{guard_fn}}: <schema>.<outbox>_guard
	GuardTrigger string // {{guard_trigger}}: the trigger on the outbox table
	// IDSeq is the sequence of the outbox's id column (BIGSERIAL, so
	// <outbox>_id_seq: Tables.Validate keeps the name short enough that
	// Postgres does not cut it). The WAL-only emit modes draw ids from it.
	IDSeq string // {{id_seq}}
	// IDDrawnFn (migration 7) tells the guard whether an inserted row's id
	// is the one this session's sequence just drew.
	IDDrawnFn string // {{id_drawn_fn}}: <schema>.<outbox>_id_drawn
	// EmitMessageFn (migration 7) writes a message-mode event: the only
	// way producers write one, so that its id is drawn, not chosen.
	EmitMessageFn string // {{emit_message_fn}}: <schema>.<outbox>_emit_message
	// MessagePrefix is the prefix of the outbox's logical messages
	// (outbox.Tables.MessagePrefix), a string literal.
	MessagePrefix string // {{message_prefix}}
	// Binary payloads (migrate.Migrator.EnableBinaryPayloads): the SQL
	// emit function for exact bytes, and the CHECK constraints that keep
	// exactly one of payload and payload_bytes set, on the outbox and on
	// its parked table.
	EmitBytesFn        string // {{emit_bytes_fn}}: <schema>.<outbox>_emit_bytes
	PayloadCheck       string // {{payload_check}}: <outbox>_payload_kind
	ParkedPayloadCheck string // {{parked_payload_check}}: <outbox>_parked_payload_kind
	// PayloadJSONOnly is the CHECK that turning binary payloads off adds
	// for a moment, to refuse new binary rows and prove none is left.
	PayloadJSONOnly string // {{payload_json_only}}: <outbox>_payload_json_only
	// Partitioning is the table of a partitioned outbox's settings and
	// retention state (migrate.Migrator.EnablePartitioned).
	Partitioning string // {{partitioning}}: <outbox>_partitioning
	// LayoutMove records a move of the outbox table between the plain
	// and the partitioned layouts (migrate.Migrator.Convert, Revert):
	// where it stands, and the table a revert retired.
	LayoutMove string // {{layout_move}}: <outbox>_layout_move
	// Lanes are the polling relay's exactly-once lanes (migration 8): one
	// row per lane, its lease, and the batch reserved for the broker
	// transaction in flight.
	Lanes string // {{lanes}}: <outbox>_lanes
}

// For derives every identifier of one outbox from its schema, outbox table
// and processed table (outbox.Tables with defaults applied and validated).
// The names of the tables and indexes beside the outbox derive from its
// name, cut to Postgres' identifier length.
func For(schema, outbox, processed string) Idents {
	q := func(name string) string { return pgident.Qualified(schema, trim(name)) }
	return Idents{
		Schema:         pgident.Quote(schema),
		Outbox:         q(outbox),
		Processed:      q(processed),
		Failures:       q(outbox + "_failures"),
		Parked:         q(outbox + "_parked"),
		Migrations:     q(outbox + "_migrations"),
		PendingIdx:     pgident.Quote(trim(outbox + "_pending_idx")),
		AggregateIdx:   pgident.Quote(trim(outbox + "_aggregate_pending_idx")),
		ProcessedAtIdx: pgident.Quote(trim(processed + "_processed_at_idx")),
		EmitFn:         q(outbox + "_emit"),
		EmitLockNS:     strconv.Itoa(int(lockkey.Emit(schema, outbox))),
		Channel:        "'" + lockkey.Channel(schema, outbox) + "'", // hex digits only: nothing to escape
		GuardFn:        q(outbox + "_guard"),
		GuardTrigger:   pgident.Quote(trim(outbox + "_guard")),
		IDSeq:          q(outbox + "_id_seq"),
		IDDrawnFn:      q(outbox + "_id_drawn"),
		EmitMessageFn:  q(outbox + "_emit_message"),
		MessagePrefix:  "'" + strings.ReplaceAll("outbox:"+schema+"."+outbox, "'", "''") + "'",

		EmitBytesFn:        q(outbox + "_emit_bytes"),
		PayloadCheck:       pgident.Quote(trim(outbox + "_payload_kind")),
		ParkedPayloadCheck: pgident.Quote(trim(outbox + "_parked_payload_kind")),
		PayloadJSONOnly:    pgident.Quote(trim(outbox + "_payload_json_only")),
		Partitioning:       q(outbox + "_partitioning"),
		LayoutMove:         q(outbox + "_layout_move"),
		Lanes:              q(outbox + "_lanes"),
	}
}

func trim(s string) string {
	if len(s) > pgident.MaxLen {
		return s[:pgident.MaxLen]
	}
	return s
}

func (ids Idents) lookup(name string) string {
	switch name {
	case "schema":
		return ids.Schema
	case "outbox":
		return ids.Outbox
	case "processed":
		return ids.Processed
	case "failures":
		return ids.Failures
	case "parked":
		return ids.Parked
	case "migrations":
		return ids.Migrations
	case "pending_idx":
		return ids.PendingIdx
	case "aggregate_idx":
		return ids.AggregateIdx
	case "processed_at_idx":
		return ids.ProcessedAtIdx
	case "emit_fn":
		return ids.EmitFn
	case "emit_lock_ns":
		return ids.EmitLockNS
	case "channel":
		return ids.Channel
	case "guard_fn":
		return ids.GuardFn
	case "guard_trigger":
		return ids.GuardTrigger
	case "id_seq":
		return ids.IDSeq
	case "id_drawn_fn":
		return ids.IDDrawnFn
	case "emit_message_fn":
		return ids.EmitMessageFn
	case "message_prefix":
		return ids.MessagePrefix
	case "emit_bytes_fn":
		return ids.EmitBytesFn
	case "payload_check":
		return ids.PayloadCheck
	case "parked_payload_check":
		return ids.ParkedPayloadCheck
	case "payload_json_only":
		return ids.PayloadJSONOnly
	case "partitioning":
		return ids.Partitioning
	case "layout_move":
		return ids.LayoutMove
	case "lanes":
		return ids.Lanes
	}
	return ""
}

// Render fills stmt's placeholders with ids. It panics on a placeholder it
// does not know or an identifier ids lacks (a zero Idents): statements are
// constants, so that is a bug every test that builds the component finds.
func Render(stmt string, ids Idents) string {
	var b strings.Builder
	b.Grow(len(stmt) + 256)
	for {
		i := strings.Index(stmt, "{{")
		if i < 0 {
			b.WriteString(stmt)
			return b.String()
		}
		j := strings.Index(stmt[i:], "}}")
		if j < 0 {
			panic(fmt.Sprintf("sqltext: unclosed placeholder at %q", stmt[i:min(len(stmt), i+40)]))
		}
		name := stmt[i+2 : i+j]
		v := ids.lookup(name)
		if v == "" {
			panic(fmt.Sprintf("sqltext: no identifier for placeholder {{%s}} (known: schema, outbox, processed, failures, parked, migrations, pending_idx, aggregate_idx, processed_at_idx, emit_fn, emit_lock_ns, channel, guard_fn, guard_trigger, id_seq, id_drawn_fn, emit_message_fn, message_prefix, emit_bytes_fn, payload_check, parked_payload_check, payload_json_only, partitioning, layout_move, lanes)", name))
		}
		b.WriteString(stmt[:i])
		b.WriteString(v)
		stmt = stmt[i+j+2:]
	}
}

// Statement is one named statement of a package, before rendering.
type Statement struct {
	// Name is "package.constant", e.g. "relay.claimSQL".
	Name string
	// SQL has placeholders for Render.
	SQL string
	// Template is set for a statement that also names one table known
	// only at run time (a partition of the outbox): a %s that the
	// package fills, after Render, with that table's quoted name. It is
	// rendered like any other, but not planned: it is DDL, or a probe of
	// a table detached from the outbox.
	Template bool
}

var (
	mu         sync.Mutex
	statements []Statement
)

// Register lists a package's statements for the tests that render and
// EXPLAIN all of them. Call it once per package, from a package-level var
// in its sql.go, beside the constants.
func Register(pkg string, stmts map[string]string) struct{} {
	mu.Lock()
	defer mu.Unlock()
	for name, sql := range stmts {
		statements = append(statements, Statement{Name: pkg + "." + name, SQL: sql})
	}
	return struct{}{}
}

// RegisterTemplates is Register for statements that also name one table
// known only at run time (Statement.Template).
func RegisterTemplates(pkg string, stmts map[string]string) struct{} {
	mu.Lock()
	defer mu.Unlock()
	for name, sql := range stmts {
		statements = append(statements, Statement{Name: pkg + "." + name, SQL: sql, Template: true})
	}
	return struct{}{}
}

// Registered returns every registered statement, sorted by name.
func Registered() []Statement {
	mu.Lock()
	defer mu.Unlock()
	out := slices.Clone(statements)
	slices.SortFunc(out, func(a, b Statement) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// HeldRows is what makes a pending row held, a fragment of the statements
// that count or skip held rows (ops, ops/switchover): a failures row (one
// per event, primary key event_id) recorded since the row last became
// pending. A failure older than that belongs to an earlier life of the row,
// before `outbox events replay` or `unpark` requeued it. The failures table
// is tiny and each of its rows finds its outbox row by primary key.
const HeldRows = `SELECT f.event_id, o.aggregate_id, f.reason, f.first_failed_at FROM {{failures}} f JOIN {{outbox}} o ON o.id = f.event_id
  WHERE o.dispatched_at IS NULL AND f.failed_at >= coalesce(o.requeued_at, o.created_at)`
