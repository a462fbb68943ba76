package walrelay

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/internal/rowheaders"
)

// MessagePrefix is the prefix of the logical messages that carry events of
// the outbox t (the emit mode without a table): "outbox:<schema>.<table>".
//
// The message must be transactional (pg_logical_emit_message's first
// argument true), so that it exists iff the caller's transaction commits
// (a non-transactional one is dropped), the relayer must accept
// message-mode events (Config.Messages), and its content is one JSON
// object:
//
//	{"id": 42, "aggregate_id": "6ba7b810-...", "type": "order.placed",
//	 "payload": {...}, "headers": {"trace": "..."}}
//
// id is the event's unique id, the event_id header, drawn from the
// outbox's id sequence so that it can never equal a row's. headers is
// optional (an object of strings, none of the names the relayer sets).
// The event's time is the transaction's commit time (a created_at field
// is ignored). The payload is published as the JSON text of its field.
//
// Producers do not write these messages themselves: they call
// <outbox>_emit_message (migration 7, EmitMessageFunc), which validates
// the event, draws its id and writes the message. From SQL, in the
// transaction that makes the business writes:
//
//	SELECT public.events_outbox_emit_message($1::uuid, $2::text, $3::jsonb, $4::jsonb);
//
// The producers' role needs EXECUTE on that function only (GRANT EXECUTE
// ON FUNCTION public.events_outbox_emit_message(uuid, text, jsonb, jsonb)
// TO <role>); pg_logical_emit_message stays revoked from it (and from
// PUBLIC: SecureMessages), or it could choose ids (CheckMessages). A
// Producer with outbox.ModeMessage calls the function. It is
// t.MessagePrefix().
func MessagePrefix(t outbox.Tables) string { return t.MessagePrefix() }

// item is one event read from the WAL on its way to the broker. err is set
// when it cannot be published (it is parked); rawHeaders keep the headers
// as written, for the parked row.
type item struct {
	msg        relay.Message
	rawHeaders []byte
	err        error
}

// size is what the item weighs against MaxBatchBytes: its payload,
// headers and type, as read from the WAL.
func (it *item) size() int {
	return len(it.msg.Payload) + len(it.rawHeaders) + len(it.msg.Type)
}

// relation is a relation the stream announced; cols locates the outbox's
// columns by name (the positions are the table's, whatever they are).
type relation struct {
	outbox    bool
	partition bool // of the outbox (newRelation)
	name      string
	cols      map[string]int
}

var requiredCols = []string{"id", "aggregate_id", "type", "payload"}

func newRelation(m *pglogrepl.RelationMessage, t outbox.Tables) (*relation, error) {
	r := &relation{name: m.Namespace + "." + m.RelationName, cols: map[string]int{}}
	// A partition of a partitioned outbox (partition.Name), by its name:
	// pgoutput describes it beside the outbox even when it reports its
	// inserts as the outbox's (publish_via_partition_root). Only the
	// error for an insert reported as its own (foreignInsert) tells it
	// apart: no insert but the outbox's is ever skipped.
	r.partition = m.Namespace == t.Schema && isPartitionName(m.RelationName, t.Outbox)
	if m.Namespace != t.Schema || m.RelationName != t.Outbox {
		return r, nil
	}
	r.outbox = true
	for i, c := range m.Columns {
		r.cols[c.Name] = i
	}
	for _, c := range requiredCols {
		if _, ok := r.cols[c]; !ok {
			return nil, fmt.Errorf("walrelay: the stream's %s has no column %q; is it an outbox table (outbox migrate up)?", r.name, c)
		}
	}
	return r, nil
}

// isPartitionName reports whether name is one partition.Name gives for
// the outbox table: "<outbox>_p" and 19 digits. The move's twins
// (<outbox>_partitioned, <outbox>_plain) and a revert's <outbox>_retired
// are not.
func isPartitionName(name, outboxTable string) bool {
	digits, ok := strings.CutPrefix(name, outboxTable+"_p")
	if !ok || len(digits) != 19 {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// col returns the text of the named column, nil for NULL or a column the
// relation does not have.
func (r *relation) col(tup *pglogrepl.TupleData, name string) []byte {
	i, ok := r.cols[name]
	if !ok || i >= len(tup.Columns) {
		return nil
	}
	c := tup.Columns[i]
	if c.DataType != pglogrepl.TupleDataTypeText {
		return nil
	}
	return c.Data
}

// timestampLayout is timestamptz as Postgres prints it with DateStyle ISO
// and TimeZone UTC, which the replication connection sets.
const timestampLayout = "2006-01-02 15:04:05.999999-07"

// insertItem turns an inserted outbox row into an item, as the polling
// relay's claim does: the same Message, headers decoded by
// rowheaders.Decode, topic by the sink's routing.
func (r *relation) insertItem(tup *pglogrepl.TupleData, routing outbox.Routing) (item, error) {
	var it item
	id, err := strconv.ParseInt(string(r.col(tup, "id")), 10, 64)
	if err != nil {
		return it, fmt.Errorf("walrelay: %s row with id %q: %w", r.name, clip.Text(string(r.col(tup, "id")), 40), err)
	}
	it.msg.ID = id
	if it.msg.AggregateID, err = uuid.ParseBytes(r.col(tup, "aggregate_id")); err != nil {
		it.err = relay.PermanentReason(relay.ReasonUndecodable, fmt.Errorf("aggregate_id %q: %w", clip.Text(string(r.col(tup, "aggregate_id")), 40), err))
	}
	it.msg.Type = string(r.col(tup, "type"))
	it.msg.Payload = r.col(tup, "payload")
	if ct := r.col(tup, "content_type"); ct != nil {
		// A binary payload (an outbox with binary payloads on): bytea
		// in hex, which the replication connection asks for.
		it.msg.ContentType = string(ct)
		if it.msg.Payload, err = decodeBytea(r.col(tup, "payload_bytes")); err != nil {
			it.err = relay.PermanentReason(relay.ReasonUndecodable, err)
		}
	} else if it.msg.Payload == nil {
		it.err = relay.PermanentReason(relay.ReasonUndecodable, errors.New("the row has no payload"))
	}
	it.rawHeaders = r.col(tup, "headers")
	created := r.col(tup, "requeued_at")
	if created == nil {
		created = r.col(tup, "created_at")
	}
	if created != nil {
		it.msg.CreatedAt, _ = time.Parse(timestampLayout, string(created))
	}
	it.finish(routing)
	return it, nil
}

// decodeBytea decodes a bytea column's text in hex ("\x" and the digits).
func decodeBytea(text []byte) ([]byte, error) {
	if !bytes.HasPrefix(text, []byte(`\x`)) {
		return nil, fmt.Errorf("payload_bytes is not bytea in hex (bytea_output=hex): %q", clip.Text(string(text), 40))
	}
	out := make([]byte, hex.DecodedLen(len(text)-2))
	if _, err := hex.Decode(out, text[2:]); err != nil {
		return nil, fmt.Errorf("payload_bytes: %w", err)
	}
	return out, nil
}

// wireEvent is the JSON content of an event's logical message.
type wireEvent struct {
	ID          int64           `json:"id"`
	AggregateID uuid.UUID       `json:"aggregate_id"`
	Type        string          `json:"type"`
	Payload     json.RawMessage `json:"payload"`
	Headers     json.RawMessage `json:"headers"`
}

// messageItem decodes an event's logical message. An event without an id
// cannot be published, nor parked: it is returned as an error. Its time is
// the commit's: a created_at in the message is the writer's, not taken.
func messageItem(content []byte, committed time.Time, routing outbox.Routing) (item, error) {
	var ev wireEvent
	var it item
	if err := json.Unmarshal(content, &ev); err != nil || ev.ID <= 0 {
		if err == nil {
			err = errors.New(`no positive "id"`)
		}
		return it, fmt.Errorf("walrelay: a logical message of the outbox is not an event (%s): %s", err, clip.Text(string(content), 200))
	}
	it.msg = relay.Message{ID: ev.ID, AggregateID: ev.AggregateID, Type: ev.Type, Payload: ev.Payload, CreatedAt: committed}
	if len(ev.Headers) > 0 {
		it.rawHeaders = ev.Headers
	}
	switch {
	case ev.AggregateID == uuid.Nil:
		it.err = relay.PermanentReason(relay.ReasonUndecodable, errors.New(`the event's message has no "aggregate_id"`))
	case len(ev.Payload) == 0:
		// A JSON null payload is published as "null", as a row's is.
		it.err = relay.PermanentReason(relay.ReasonUndecodable, errors.New(`the event's message has no "payload"`))
	}
	it.finish(routing)
	return it, nil
}

// finish decodes the headers and routes the type to its topic, as the
// polling relay does; a failure is the item's, permanent. The contract
// check comes later, batch by batch (checkContracts).
func (it *item) finish(routing outbox.Routing) {
	var err error
	it.msg.Headers, err = rowheaders.Decode(it.rawHeaders, relay.PermanentReason)
	if err == nil {
		it.msg.Topic, err = routing.Destination(it.msg.Type)
		err = relay.PermanentReason(relay.ReasonInvalidTopic, err)
	}
	if it.err == nil {
		it.err = err
	}
}

// decode applies one pgoutput message to the stream's state.
func (st *streamer) decode(xld pglogrepl.XLogData) error {
	m, err := pglogrepl.Parse(xld.WALData)
	if err != nil {
		return fmt.Errorf("decode pgoutput message at %s: %w", xld.WALStart, err)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		rel, err := newRelation(m, st.r.cfg.Tables)
		if err != nil {
			return err
		}
		st.rels[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		st.inTx = true
		st.commit = m.CommitTime
		if st.lc != nil {
			// Behind, the walsender is the bottleneck: read it without
			// pause (lingering would slow the draining of a backlog of
			// small transactions).
			st.lc.behind.Store(time.Since(m.CommitTime) > behindAge)
		}
	case *pglogrepl.CommitMessage:
		st.inTx = false
		st.checkpoint(m.TransactionEndLSN, m.CommitTime)
		if len(st.pending) == 1 {
			st.r.oldestUnacked.Store(st.pending[0].committed.UnixNano())
		}
	case *pglogrepl.InsertMessage:
		rel, ok := st.rels[m.RelationID]
		if !ok {
			return fmt.Errorf("walrelay: insert into relation %d before its description", m.RelationID)
		}
		if !rel.outbox {
			return st.foreignInsert(rel)
		}
		it, err := rel.insertItem(m.Tuple, st.r.routing)
		if err != nil {
			return err
		}
		st.enqueue(it)
	case *pglogrepl.LogicalDecodingMessage:
		st.decodeMessage(m)
	}
	return nil
}

// foreignInsert is the error for an insert the stream reports under a
// relation that is not the outbox table. The relayer's publication holds
// the outbox alone (its partitions' inserts reported as its own), so such
// an insert means the publication is not what Setup made, and it may be
// an event: skipping it would confirm the slot past it without a trace.
// The stream stops before the transaction's commit is acknowledged, and
// a restart reads it again.
func (st *streamer) foreignInsert(rel *relation) error {
	cfg := st.r.cfg
	if rel.partition {
		return fmt.Errorf("%w: the stream reports an insert into %s, a partition of %s, instead of into the table: its publication %s must have publish_via_partition_root = true; nothing from there on is acknowledged. Switch the outbox to the polling relay (outbox switch to-poll), drop the slot and the publication (outbox relay --mode wal --teardown), and come back (outbox switch to-wal)",
			ErrNotThisOutbox, clip.Text(rel.name, 200), cfg.Tables.OutboxIdent(), cfg.Publication)
	}
	return fmt.Errorf("%w: the stream reports an insert into %s, which is not the outbox table %s: publication %s publishes another table (SELECT * FROM pg_publication_tables WHERE pubname = '%s'); nothing from there on is acknowledged. Give the outbox a publication of its own: switch it to the polling relay (outbox switch to-poll), drop the slot and the publication (outbox relay --mode wal --teardown), and come back (outbox switch to-wal)",
		ErrNotThisOutbox, clip.Text(rel.name, 200), cfg.Tables.OutboxIdent(), cfg.Publication, cfg.Publication)
}

// decodeMessage applies a logical decoding message: an event (message
// mode), or a heartbeat, which is a position to acknowledge.
func (st *streamer) decodeMessage(m *pglogrepl.LogicalDecodingMessage) {
	if m.Prefix == st.r.prefix {
		// Only a transactional message exists iff its transaction
		// committed (pgoutput sends it with the commit, and never
		// for a rollback); a non-transactional one is written at
		// once, rolled back or not, so it is never an event. And
		// only an outbox in message mode takes events from messages
		// (Config.Messages, which Run lets start only once no role
		// but the producers can write them).
		switch {
		case !m.Transactional:
			st.r.dropped.Add(1)
			st.r.log.Error("wal relay dropped a non-transactional logical message with the outbox's prefix: it is no event (it exists whether or not a transaction commits); producers write transactional messages (outbox.ModeMessage)", "lsn", m.LSN.String())
		case !st.r.cfg.Messages:
			st.r.dropped.Add(1)
			st.r.log.Error("wal relay dropped a logical message with the outbox's prefix: message-mode events are off; if this outbox's producers use outbox.ModeMessage, secure pg_logical_emit_message and start the relay with --messages (Config.Messages)", "lsn", m.LSN.String())
		default:
			it, err := messageItem(m.Content, st.commit, st.r.routing)
			if err != nil {
				st.r.dropped.Add(1)
				st.r.log.Error("wal relay dropped a logical message with the outbox's prefix that is not an event", "lsn", m.LSN.String(), "err", err)
			} else {
				st.enqueue(it)
			}
		}
		if m.Transactional {
			return
		}
	}
	if !m.Transactional {
		// A heartbeat (ours, or any other non-transactional message):
		// everything before it has been sent.
		if m.Prefix == HeartbeatPrefix {
			st.r.heartbeats.Add(1)
		}
		// m.LSN is the end of the message's record, which is where
		// the next record starts: confirming one byte more would
		// let the slot skip a transaction whose commit record
		// follows the message (a heartbeat from another session
		// lands between a transaction's inserts and its commit).
		if !st.inTx {
			st.checkpoint(m.LSN, time.Time{})
		}
	}
}
