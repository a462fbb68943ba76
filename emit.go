package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"

	"github.com/pgoutbox/outbox/internal/lockkey"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// DefaultLockBuckets bounds how many distinct advisory locks one EmitBatch
// takes: aggregates hash into this many keys. Advisory locks live in the
// shared lock table (max_locks_per_transaction x max_connections, 6,400
// slots by default), so one key per aggregate would let a large batch fill it.
const DefaultLockBuckets = 1024

// Config configures a Producer. The zero value is usable.
type Config struct {
	// Tables names the outbox table. Defaults to public.events_outbox.
	Tables Tables
	// Routing is the sink's say on an event before it is written: its
	// destination, and its size against the sink's limit. Emit refuses an
	// event the sink would refuse. It must route as the relayer's sink
	// does. Defaults to KafkaRouting{TopicPrefix, MaxRecordBytes} of the
	// two fields below.
	Routing Routing
	// TopicPrefix is prepended to the topic derived from an event's type;
	// Emit checks the result is a valid topic. It must match the relayer's.
	// It configures the default Kafka routing only: with Routing set,
	// leave it empty. Defaults to "".
	TopicPrefix string
	// MaxRecordBytes is the largest Kafka record batch an event may make,
	// as the broker will see it (KafkaRouting.Size): the payload as
	// Postgres prints its JSONB, the key, the event's headers and the
	// relayer's. Emit refuses a larger event, which the broker would
	// refuse; set it to the topics' max.message.bytes. It configures the
	// default Kafka routing only: with Routing set, leave it 0. Defaults
	// to DefaultMaxRecordBytes (1048588, Kafka's default
	// message.max.bytes).
	MaxRecordBytes int
	// Mode is how an event is written: a row (ModeInsert, read by both
	// relay sources), a row deleted in the same transaction
	// (ModeInsertDelete) or a logical message (ModeMessage); the last two
	// are published by the WAL source only. Defaults to ModeInsert.
	Mode Mode
	// DisableAggregateLock turns off the per-aggregate advisory lock. With
	// it off, two transactions emitting for one aggregate may commit out of
	// id order, and the polling relayer may then publish them out of
	// commit order. The WAL source publishes in commit order without it:
	// with ModeInsert and only `outbox relay --mode wal`, turning it off
	// costs no order (the WAL-only modes never take it). Otherwise turn it
	// off only when no consumer relies on per-aggregate order. Defaults to
	// false (lock on).
	DisableAggregateLock bool
	// LockBuckets is the number of advisory lock keys aggregates hash into.
	// Defaults to DefaultLockBuckets (1024).
	LockBuckets int
	// DisableNotify stops Emit from sending a NOTIFY that wakes idle
	// relayers at commit. With it off, relayers find new rows at their poll
	// interval. The WAL source does not listen: with it, turn NOTIFY off
	// (the WAL-only modes never send it). Defaults to false (notify on).
	DisableNotify bool
	// NotifyInterval is the least time between two NOTIFYs of this
	// Producer; an Emit within it of the last one that notified does not
	// notify. Postgres serialises notifying commits on one database-wide
	// lock held until their commit record is flushed, so a NOTIFY per
	// transaction costs a busy producer much of its commit rate
	// (BENCHMARKS.md has figures).
	// The relayer a NOTIFY woke keeps polling quickly while it finds rows
	// (relay.Config.BusyPollInterval), which picks up the events that did
	// not notify. One that commits long after its Emit, when no other event
	// follows, can wait for the relayer's poll interval. Defaults to
	// DefaultNotifyInterval (10ms); a negative value notifies on every Emit.
	NotifyInterval time.Duration
	// Propagator writes the trace context of the span in Emit's ctx into
	// the event's headers (traceparent and tracestate with the default), so
	// the relayer's publish span links to the emitting span and the
	// consumer's span continues its trace. Only a ctx holding a valid span
	// context is injected; a header the caller set is kept, and a caller
	// that sets traceparent keeps the whole trace context its own. The
	// injected headers count toward the Routing's limit. The relayer and
	// consumers must use a propagator that reads what this one writes.
	// Defaults to propagation.TraceContext{} (W3C Trace Context).
	Propagator propagation.TextMapPropagator
	// BinaryPayloads says that the table was migrated with binary payloads
	// on (`outbox migrate up --binary-payloads`): Emit then writes Bytes
	// payloads, exact bytes with their content type, beside JSON ones. A
	// table without the setting refuses the statements that write them;
	// with the setting off, Emit refuses a Bytes payload before any SQL
	// (ErrBinaryPayloadsOff). ModeMessage carries JSON only. Defaults to
	// false.
	BinaryPayloads bool
	// Contracts checks each event's payload against its type's contract
	// (package contracts: contracts.Load implements it) before any SQL
	// runs. A payload that breaks it is refused with an error that
	// errors.Is ErrContractViolation and carries the contract's own error
	// (a *contracts.Violation names the JSON pointer and the rule). The
	// version checked (Event.Version, or the type's latest) travels with
	// the event in its event_version header. Defaults to nil: no check,
	// and an event_version header only when Event.Version is set.
	Contracts Contracts
}

// Contracts checks an event's payload against its type's contract.
// *contracts.Set implements it.
type Contracts interface {
	// Check validates payload (JSON text) as version (0: the latest) of
	// eventType's contract and returns the version it checked, or 0 when
	// the type has no contract and none is required.
	Check(eventType string, version int, payload []byte) (int, error)
}

// DefaultNotifyInterval is Config.NotifyInterval's default.
const DefaultNotifyInterval = 10 * time.Millisecond

// Producer writes events into the outbox inside the caller's transaction.
// It is safe for concurrent use. The package-level Emit functions use a
// Producer with the default Config.
type Producer struct {
	cfg     Config
	lockNS  int32
	channel string
	// The statements (sql.go), indexed by whether they notify: one for a
	// single event, one for a batch. In the WAL-only modes only [0] is
	// used, and deleteOne and deleteBatch follow ModeInsertDelete's
	// inserts.
	oneSQL, batchSQL       [2]string
	deleteOne, deleteBatch string

	epoch      time.Time
	lastNotify atomic.Int64 // nanoseconds since epoch, 0 before the first
}

// NewProducer applies cfg's defaults, validates it and prepares the
// insert statements.
func NewProducer(cfg Config) (*Producer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Mode.WALOnly() {
		cfg.DisableAggregateLock = true
		cfg.DisableNotify = true
	}
	if cfg.NotifyInterval < 0 {
		cfg.NotifyInterval = 0 // notify on every Emit
	}
	p := &Producer{
		cfg:     cfg,
		lockNS:  cfg.Tables.LockNamespace(),
		channel: cfg.Tables.Channel(),
		epoch:   time.Now(),
	}
	ids := idents(cfg.Tables)
	p.oneSQL = [2]string{sqltext.Render(insertOneSQL, ids), sqltext.Render(insertOneNotifySQL, ids)}
	if !cfg.DisableAggregateLock {
		p.oneSQL = [2]string{sqltext.Render(insertOneLockSQL, ids), sqltext.Render(insertOneLockNotifySQL, ids)}
	}
	p.batchSQL = [2]string{sqltext.Render(insertBatchSQL, ids), sqltext.Render(insertBatchNotifySQL, ids)}
	if cfg.BinaryPayloads {
		p.oneSQL = [2]string{sqltext.Render(insertBinaryOneSQL, ids), sqltext.Render(insertBinaryOneNotifySQL, ids)}
		if !cfg.DisableAggregateLock {
			p.oneSQL = [2]string{sqltext.Render(insertBinaryOneLockSQL, ids), sqltext.Render(insertBinaryOneLockNotifySQL, ids)}
		}
		p.batchSQL = [2]string{sqltext.Render(insertBinaryBatchSQL, ids), sqltext.Render(insertBinaryBatchNotifySQL, ids)}
	}
	switch cfg.Mode {
	case ModeInsertDelete:
		p.deleteOne = sqltext.Render(deleteOneSQL, ids)
		p.deleteBatch = sqltext.Render(deleteBatchSQL, ids)
	case ModeMessage:
		p.oneSQL[0] = sqltext.Render(messageOneSQL, ids)
		p.batchSQL[0] = sqltext.Render(messageBatchSQL, ids)
	}
	return p, nil
}

// WithDefaults returns cfg with its zero fields set to their defaults:
// with Routing nil, MaxRecordBytes to DefaultMaxRecordBytes and Routing to
// the KafkaRouting of TopicPrefix and MaxRecordBytes. Negative values are
// left for Validate to refuse (a negative NotifyInterval is kept: it
// means notify on every Emit).
func (cfg Config) WithDefaults() Config {
	cfg.Tables = cfg.Tables.WithDefaults()
	if cfg.Routing == nil {
		if cfg.MaxRecordBytes == 0 {
			cfg.MaxRecordBytes = DefaultMaxRecordBytes
		}
		cfg.Routing = KafkaRouting{TopicPrefix: cfg.TopicPrefix, MaxRecordBytes: cfg.MaxRecordBytes}
	}
	if cfg.LockBuckets == 0 {
		cfg.LockBuckets = DefaultLockBuckets
	}
	if cfg.NotifyInterval == 0 {
		cfg.NotifyInterval = DefaultNotifyInterval
	}
	if cfg.Propagator == nil {
		cfg.Propagator = defaultPropagator()
	}
	return cfg
}

// Validate reports the first field of cfg (with its defaults applied)
// that a Producer cannot use, saying what to set instead.
func (cfg Config) Validate() error {
	if err := cfg.Tables.Validate(); err != nil {
		return err
	}
	if cfg.Routing != nil && (cfg.TopicPrefix != "" || cfg.MaxRecordBytes != 0) &&
		cfg.Routing != (KafkaRouting{TopicPrefix: cfg.TopicPrefix, MaxRecordBytes: cfg.MaxRecordBytes}) {
		return fmt.Errorf("outbox: Config.Routing is set (%T), and so are TopicPrefix or MaxRecordBytes, which configure only the default Kafka routing; leave them empty and configure the routing itself (e.g. KafkaRouting{TopicPrefix: ...})", cfg.Routing)
	}
	cfg = cfg.WithDefaults()
	if k, ok := cfg.Routing.(KafkaRouting); ok && k == (KafkaRouting{TopicPrefix: cfg.TopicPrefix, MaxRecordBytes: cfg.MaxRecordBytes}) {
		if err := k.Validate(); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
	} else if v, ok := cfg.Routing.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("outbox: Config.Routing: %w", err)
		}
	}
	if cfg.LockBuckets < 0 {
		return fmt.Errorf("outbox: LockBuckets is %d; use a positive number, or 0 for the default", cfg.LockBuckets)
	}
	if cfg.Mode < ModeInsert || cfg.Mode > ModeMessage {
		return fmt.Errorf("outbox: Mode is %d; use ModeInsert, ModeInsertDelete or ModeMessage", int(cfg.Mode))
	}
	if cfg.BinaryPayloads && cfg.Mode == ModeMessage {
		return fmt.Errorf("outbox: BinaryPayloads is set with ModeMessage, whose logical messages carry JSON payloads only; use ModeInsert or ModeInsertDelete")
	}
	return nil
}

// notify reports whether this Emit sends the NOTIFY: the first one after
// NotifyInterval does.
func (p *Producer) notify() bool {
	if p.cfg.DisableNotify {
		return false
	}
	now := max(int64(time.Since(p.epoch)), 1)
	last := p.lastNotify.Load()
	if last != 0 && now-last < int64(p.cfg.NotifyInterval) {
		return false
	}
	return p.lastNotify.CompareAndSwap(last, now) // lost: another Emit just took it
}

// Config returns the producer's configuration with defaults applied.
func (p *Producer) Config() Config { return p.cfg }

// Emit writes one event into the outbox within tx and returns its id (the
// event_id header consumers will see). The event exists iff tx commits, so
// pass the transaction that makes your business writes. It takes a pgx.Tx,
// not a pool or connection, because an insert outside that transaction
// would publish events for writes that may roll back.
//
// When ctx holds a span (OpenTelemetry), its trace context is added to the
// event's headers (see Config.Propagator).
func (p *Producer) Emit(ctx context.Context, tx pgx.Tx, ev Event) (int64, error) {
	if p.cfg.Mode == ModeInsertDelete {
		// The insert and its delete in one round trip.
		b := &pgx.Batch{}
		q, err := p.QueueEmit(ctx, b, ev)
		if err != nil {
			return 0, err
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return 0, err
		}
		return q.ID, nil
	}
	sql, args, err := p.prepareOne(ctx, ev)
	if err != nil {
		return 0, err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return 0, p.insertErr(err)
	}
	id, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, p.insertErr(err)
	}
	return id, nil
}

// Queued is an event QueueEmit put on a pgx.Batch.
type Queued struct {
	// ID is the event's id, set when the batch's results are closed
	// (BatchResults.Close, as tx.SendBatch(ctx, batch).Close() does). Read
	// the batch's results one by one instead (QueryRow, Exec) and pgx
	// skips this query's callback: ID stays 0, and in ModeInsertDelete
	// the check that the delete removed the row does not run.
	ID int64
}

// QueueEmit is Emit without a round trip of its own: it queues the insert
// on batch, to go to the database with the statements queued beside it
// (tx.SendBatch(ctx, batch) in the transaction that makes your business
// writes). The event exists iff that transaction commits. An invalid event
// returns its error here and queues nothing. In ModeInsertDelete it queues
// two statements, the insert and its delete.
//
//	batch := &pgx.Batch{}
//	batch.Queue("INSERT INTO orders (id, customer) VALUES ($1, $2)", id, customer)
//	ev, err := producer.QueueEmit(ctx, batch, outbox.Event{AggregateID: id, Type: "order.placed", Payload: order})
//	err = tx.SendBatch(ctx, batch).Close() // ev.ID is set
//
// The trace context of the span in ctx is added to the event's headers, as
// Emit adds it (Config.Propagator). ctx is read for the span only: the
// insert runs when the batch is sent.
func (p *Producer) QueueEmit(ctx context.Context, batch *pgx.Batch, ev Event) (*Queued, error) {
	sql, args, err := p.prepareOne(ctx, ev)
	if err != nil {
		return nil, err
	}
	q := &Queued{}
	batch.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&q.ID); err != nil {
			return p.insertErr(err)
		}
		return nil
	})
	if p.cfg.Mode == ModeInsertDelete {
		batch.Queue(p.deleteOne).Fn = func(br pgx.BatchResults) error {
			ct, err := br.Exec()
			return p.checkDeleted(ct.RowsAffected(), 1, err)
		}
	}
	return q, nil
}

func (p *Producer) insertErr(err error) error {
	return fmt.Errorf("outbox: insert into %s: %w", p.cfg.Tables.OutboxIdent(), err)
}

// prepareOne adds ctx's trace context to ev's headers, validates ev and
// picks the single-event statement and its arguments (all text or scalar:
// they bind through database/sql too).
func (p *Producer) prepareOne(ctx context.Context, ev Event) (string, []any, error) {
	ev.Headers = withTrace(ev.Headers, p.traceHeaders(ctx))
	r, err := p.validate(ev, "")
	if err != nil {
		return "", nil, err
	}
	args := []any{ev.AggregateID.String(), ev.Type, string(r.payload), r.headers}
	if p.cfg.BinaryPayloads {
		args = r.binaryArgs(args)
	}
	if p.cfg.Mode == ModeMessage {
		return p.oneSQL[0], args, nil
	}
	if !p.cfg.DisableAggregateLock {
		args = append(args, p.lockNS, p.lockKey(ev.AggregateID))
	}
	notify := p.notify()
	if notify {
		args = append(args, p.channel)
	}
	return p.oneSQL[b2i(notify)], args, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// EmitBatch writes events into the outbox within tx in one round trip and
// returns their ids, in input order. Every event is validated first: on a
// validation error nothing is sent and tx is untouched.
func (p *Producer) EmitBatch(ctx context.Context, tx pgx.Tx, events []Event) ([]int64, error) {
	return p.emitBatch(ctx, tx, events, "")
}

// emitBatch is EmitBatch; versions, when not "", is the event_versions
// header every event gets (EmitVersions).
func (p *Producer) emitBatch(ctx context.Context, tx pgx.Tx, events []Event, versions string) ([]int64, error) {
	sql, args, err := p.prepare(ctx, events, false, versions)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, p.insertErr(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, p.insertErr(err)
	}
	if p.cfg.Mode == ModeInsertDelete {
		ct, err := tx.Exec(ctx, p.deleteBatch, ids)
		if err = p.checkDeleted(ct.RowsAffected(), len(ids), err); err != nil {
			return nil, err
		}
	}
	return p.orderIDs(ids, len(events))
}

// EmitSQL is Emit for a database/sql transaction (any Postgres driver):
// the event exists iff tx commits.
func (p *Producer) EmitSQL(ctx context.Context, tx *sql.Tx, ev Event) (int64, error) {
	query, args, err := p.prepareOne(ctx, ev)
	if err != nil {
		return 0, err
	}
	ids, err := p.collectSQL(ctx, tx, query, args, 1)
	if err == nil {
		ids, err = p.orderIDs(ids, 1)
	}
	if err == nil {
		err = p.deleteSQL(ctx, tx, ids)
	}
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// EmitBatchSQL is EmitBatch for a database/sql transaction.
func (p *Producer) EmitBatchSQL(ctx context.Context, tx *sql.Tx, events []Event) ([]int64, error) {
	return p.emitBatchSQL(ctx, tx, events, "")
}

// emitBatchSQL is EmitBatchSQL; versions as for emitBatch.
func (p *Producer) emitBatchSQL(ctx context.Context, tx *sql.Tx, events []Event, versions string) ([]int64, error) {
	query, args, err := p.prepare(ctx, events, true, versions)
	if err != nil {
		return nil, err
	}
	ids, err := p.collectSQL(ctx, tx, query, args, len(events))
	if err != nil {
		return nil, err
	}
	if err := p.deleteSQL(ctx, tx, ids); err != nil {
		return nil, err
	}
	return p.orderIDs(ids, len(events))
}

// deleteSQL deletes the rows just inserted, in ModeInsertDelete.
func (p *Producer) deleteSQL(ctx context.Context, tx *sql.Tx, ids []int64) error {
	if p.cfg.Mode != ModeInsertDelete {
		return nil
	}
	lit := make([]string, len(ids))
	for i, id := range ids {
		lit[i] = strconv.FormatInt(id, 10)
	}
	res, err := tx.ExecContext(ctx, p.deleteBatch, "{"+strings.Join(lit, ",")+"}")
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	return p.checkDeleted(n, len(ids), err)
}

// checkDeleted makes the delete's error, or a count of deleted rows other
// than the inserted ones' (a trigger or rule in the way), the caller's:
// the transaction must not commit with the rows left in the table.
func (p *Producer) checkDeleted(deleted int64, inserted int, err error) error {
	if err == nil && deleted != int64(inserted) {
		err = fmt.Errorf("deleted %d rows, want the %d just inserted", deleted, inserted)
	}
	if err != nil {
		return fmt.Errorf("outbox: delete the rows just inserted from %s (ModeInsertDelete): %w", p.cfg.Tables.OutboxIdent(), err)
	}
	return nil
}

// collectSQL runs an insert through database/sql and reads its ids (n is
// the capacity to expect; orderIDs checks the count).
func (p *Producer) collectSQL(ctx context.Context, tx *sql.Tx, query string, args []any, n int) ([]int64, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, p.insertErr(err)
	}
	defer rows.Close()
	ids := make([]int64, 0, n)
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, p.insertErr(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, p.insertErr(err)
	}
	return ids, nil
}

// orderIDs maps RETURNING's ids back to input order. Ids were drawn in input
// order by one session, so they ascend with it; sorting is enough.
func (p *Producer) orderIDs(ids []int64, n int) ([]int64, error) {
	if len(ids) != n {
		return nil, fmt.Errorf("outbox: insert into %s returned %d ids for %d events", p.cfg.Tables.OutboxIdent(), len(ids), n)
	}
	slices.Sort(ids)
	return ids, nil
}

// prepare adds ctx's trace context to every event's headers, validates
// events and builds the statement's arguments. With text set, arrays are
// passed as Postgres array literals (for database/sql drivers that cannot
// bind Go slices). versions, when not "", is the event_versions header of
// a dual emit, given to every event.
func (p *Producer) prepare(ctx context.Context, events []Event, text bool, versions string) (string, []any, error) {
	if len(events) == 0 {
		return "", nil, ErrEmptyBatch
	}
	tc := p.traceHeaders(ctx) // one span for the whole batch
	aggs := make([]string, len(events))
	types := make([]string, len(events))
	payloads := make([]string, len(events))
	headers := make([]string, len(events))
	var binary [][]byte
	var contentTypes []string
	if p.cfg.BinaryPayloads {
		binary = make([][]byte, len(events))
		contentTypes = make([]string, len(events))
	}
	var keys []int32
	for i, ev := range events {
		ev.Headers = withTrace(ev.Headers, tc)
		r, err := p.validate(ev, versions)
		if err != nil {
			if versions != "" {
				return "", nil, fmt.Errorf("version %d of %s: %w", ev.Version, versions, err)
			}
			if len(events) > 1 {
				return "", nil, fmt.Errorf("event %d of %d: %w", i, len(events), err)
			}
			return "", nil, err
		}
		aggs[i] = ev.AggregateID.String()
		types[i] = ev.Type
		headers[i] = r.headers
		if r.contentType == "" {
			payloads[i] = string(r.payload)
		} else {
			binary[i], contentTypes[i] = r.payload, r.contentType
		}
		if !p.cfg.DisableAggregateLock {
			keys = append(keys, p.lockKey(ev.AggregateID))
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if keys == nil {
		keys = []int32{}
	}
	if p.cfg.Mode == ModeMessage {
		if text {
			return p.batchSQL[0], []any{textArrayLiteral(aggs), textArrayLiteral(types), textArrayLiteral(payloads), textArrayLiteral(headers)}, nil
		}
		return p.batchSQL[0], []any{aggs, types, payloads, headers}, nil
	}
	args := []any{p.lockNS, keys, aggs, types, payloads, headers}
	if text {
		args = []any{p.lockNS, int32ArrayLiteral(keys), textArrayLiteral(aggs), textArrayLiteral(types), textArrayLiteral(payloads), textArrayLiteral(headers)}
	}
	if p.cfg.BinaryPayloads {
		if text {
			args = append(args, byteaArrayLiteral(binary), textArrayLiteral(contentTypes))
		} else {
			for i := range binary {
				if binary[i] == nil {
					binary[i] = []byte{}
				}
			}
			args = append(args, binary, contentTypes)
		}
	}
	notify := p.notify()
	if notify {
		args = append(args, p.channel)
	}
	return p.batchSQL[b2i(notify)], args, nil
}

func (p *Producer) lockKey(id uuid.UUID) int32 {
	return lockkey.Bucket(id, p.cfg.LockBuckets)
}

// row is one validated event's payload, as it is written: JSON text, or a
// Bytes payload's data with its content type; and its headers as JSON ("" for
// none).
type row struct {
	payload     []byte
	contentType string // "" for JSON
	headers     string
}

// validate checks one event and returns its row. It refuses, before any SQL runs, what Postgres would refuse
// (which would abort the caller's transaction) and what the sink would, as
// its Routing says: a type with no destination, an event over the limit
// once Postgres has normalised the payload. Nothing is rewritten.
// versions, when not "", is the event_versions header to add (EmitVersions).
func (p *Producer) validate(ev Event, versions string) (row, error) {
	if ev.Type == "" {
		return row{}, fmt.Errorf("%w; set Event.Type, e.g. \"order.placed\"", ErrEmptyType)
	}
	if ev.AggregateID == uuid.Nil {
		return row{}, fmt.Errorf("%w (type %s); set Event.AggregateID to the id of the entity the event is about", ErrNilAggregate, quoteShort(ev.Type))
	}
	if _, err := p.cfg.Routing.Destination(ev.Type); err != nil {
		return row{}, err
	}
	if why := pgtext.Invalid(ev.Type); why != "" {
		return row{}, fmt.Errorf("%w: type %s %s; Postgres text cannot store it, so use valid UTF-8 without NUL characters", ErrInvalidType, quoteShort(ev.Type), why)
	}
	for k, v := range ev.Headers {
		switch {
		case k == "":
			return row{}, fmt.Errorf("%w (type %s): a header name is empty", ErrInvalidHeaders, quoteShort(ev.Type))
		case IsReservedHeader(k):
			return row{}, fmt.Errorf("%w (type %s): header %q is set by the relayer; use another name", ErrInvalidHeaders, quoteShort(ev.Type), k)
		}
		if why := pgtext.Invalid(k); why != "" {
			return row{}, fmt.Errorf("%w (type %s): header name %s %s; use valid UTF-8 without NUL characters", ErrInvalidHeaders, quoteShort(ev.Type), quoteShort(k), why)
		}
		if why := pgtext.Invalid(v); why != "" {
			return row{}, fmt.Errorf("%w (type %s): the value of header %s %s; use valid UTF-8 without NUL characters (base64-encode binary values)", ErrInvalidHeaders, quoteShort(ev.Type), quoteShort(k), why)
		}
	}
	if b, ok := binaryPayload(ev.Payload); ok {
		return p.validateBinary(ev, b, versions)
	}
	payload, err := serialise(ev.Payload)
	if err != nil {
		return row{}, fmt.Errorf("%w (type %s): %s", ErrInvalidPayload, quoteShort(ev.Type), err)
	}
	n, multiKey, err := jsonbScan(payload)
	if err != nil {
		return row{}, fmt.Errorf("%w (type %s): %s", ErrInvalidPayload, quoteShort(ev.Type), err)
	}
	if ev.Headers, err = p.checkContract(ev, payload, versions); err != nil {
		return row{}, err
	}
	if err := p.checkSize(ev, payload, n, multiKey); err != nil {
		return row{}, err
	}
	if len(ev.Headers) == 0 {
		return row{payload: payload}, nil
	}
	hdr, err := json.Marshal(ev.Headers)
	if err != nil {
		return row{}, fmt.Errorf("%w (type %s): %s", ErrInvalidHeaders, quoteShort(ev.Type), err)
	}
	return row{payload: payload, headers: string(hdr)}, nil
}

// checkContract checks payload, ev's JSON text as serialised, against its
// type's contract and returns its headers with the event_version header
// of the version checked (or of Event.Version when there are no
// contracts), and the event_versions header when versions is not "". The
// caller's map is never modified.
func (p *Producer) checkContract(ev Event, payload []byte, versions string) (map[string]string, error) {
	return versionHeaders(ev, p.cfg.Contracts, payload, versions)
}

// versionHeaders is checkContract with the contracts c (nil: none).
func versionHeaders(ev Event, c Contracts, payload []byte, versions string) (map[string]string, error) {
	if _, set := ev.Headers[HeaderEventVersion]; set {
		return nil, fmt.Errorf("%w (type %s): header %q is written from Event.Version; set that instead", ErrInvalidHeaders, quoteShort(ev.Type), HeaderEventVersion)
	}
	if _, set := ev.Headers[HeaderEventVersions]; set {
		return nil, fmt.Errorf("%w (type %s): header %q is written by EmitVersions, from the versions it is given; emit the versions with it instead", ErrInvalidHeaders, quoteShort(ev.Type), HeaderEventVersions)
	}
	if ev.Version < 0 {
		return nil, fmt.Errorf("%w (type %s): Event.Version is %d; versions start at 1 (0 means the type's latest)", ErrContractViolation, quoteShort(ev.Type), ev.Version)
	}
	version := ev.Version
	if c != nil {
		var err error
		if version, err = c.Check(ev.Type, ev.Version, payload); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrContractViolation, err)
		}
	}
	if version == 0 {
		return ev.Headers, nil
	}
	h := make(map[string]string, len(ev.Headers)+2)
	for k, v := range ev.Headers {
		h[k] = v
	}
	h[HeaderEventVersion] = strconv.Itoa(version)
	if versions != "" {
		h[HeaderEventVersions] = versions
	}
	return h, nil
}

// checkSize refuses an event larger than the routing's limit; n is the
// payload's JSONB text length, which counts every member of repeated keys
// when multiKey.
func (p *Producer) checkSize(ev Event, payload []byte, n int, multiKey bool) error {
	return p.checkSizeOf(ev, payload, n, multiKey, "the payload after Postgres' JSONB normalisation")
}

// checkSizeOf is checkSize, with what the payload's n bytes are in the
// error's words.
func (p *Producer) checkSizeOf(ev Event, payload []byte, n int, multiKey bool, what string) error {
	lim := p.cfg.Routing.Limit()
	if lim.Bytes <= 0 {
		return nil
	}
	size := p.cfg.Routing.Size(ev.Type, n, ev.Headers)
	if size > lim.Bytes && multiKey {
		// n counted every member of repeated keys; JSONB keeps one.
		n = jsonbExactLen(payload)
		size = p.cfg.Routing.Size(ev.Type, n, ev.Headers)
	}
	if size <= lim.Bytes {
		return nil
	}
	h := 0
	for k, v := range ev.Headers {
		h += len(k) + len(v)
	}
	seen := ""
	if lim.Seen != "" {
		seen = " " + lim.Seen
	}
	return fmt.Errorf("%w: type %s makes %s of %s%s, of which %s is %d bytes, the type %d and the headers %d; the limit is %s: set %s higher, or shrink the event",
		ErrPayloadTooLarge, quoteShort(ev.Type), lim.Unit, sizeText(size), seen, what, n, len(ev.Type), h, sizeText(lim.Bytes), lim.Raise)
}

// serialise returns the payload's JSON text. jsonbScan then checks it for
// what Postgres JSONB refuses.
func serialise(v any) ([]byte, error) {
	var raw []byte
	switch v := v.(type) {
	case nil:
		return nil, fmt.Errorf("payload is nil; pass a value, or json.RawMessage(`{}`) for an empty body")
	case json.RawMessage:
		raw = v
	case []byte:
		raw = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("cannot marshal %T: %s", v, err)
		}
		// Valid JSON (encoding/json checks what Marshalers return), but
		// encoding/json writes each invalid UTF-8 byte of a string as the
		// escape \ufffd, and a real U+FFFD as the character itself: an
		// escape means the value was about to be rewritten.
		if i := replacementEscape(b); i >= 0 {
			return nil, fmt.Errorf("a string in the %T is not valid UTF-8 (at byte %d of its JSON); encoding/json would replace its bad bytes with U+FFFD: fix the string, or pass the payload as raw JSON", v, i)
		}
		return b, nil
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("%d bytes of raw payload are not valid JSON; pass a Go value to marshal, or fix the bytes", len(raw))
	}
	return raw, nil
}

// replacementEscape returns where js holds the escape \ufffd (not an
// escaped backslash followed by "ufffd"), or -1.
func replacementEscape(js []byte) int {
	for off := 0; ; {
		i := bytes.Index(js[off:], []byte(`\ufffd`))
		if i < 0 {
			return -1
		}
		i += off
		slashes := 0
		for j := i - 1; j >= 0 && js[j] == '\\'; j-- {
			slashes++
		}
		if slashes%2 == 0 {
			return i
		}
		off = i + 1
	}
}

// sizeText is n bytes, with a rounded figure beside it from 1 KiB.
func sizeText(n int) string {
	if n < 1<<10 {
		return strconv.Itoa(n) + " bytes"
	}
	return strconv.Itoa(n) + " bytes (" + humanBytes(n) + ")"
}

func humanBytes(n int) string {
	switch {
	case n >= 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
	case n >= 1<<10:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
	}
	return strconv.Itoa(n) + " bytes"
}

// textArrayLiteral renders a Postgres array literal of strings; "" stands
// for SQL NULL only through the NULLIF in the statement, so every element
// is quoted.
func textArrayLiteral(vals []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(v); j++ {
			if v[j] == '"' || v[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(v[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// byteaArrayLiteral renders a Postgres array literal of bytea values, each
// in bytea's hex input form (\x and the digits).
func byteaArrayLiteral(vals [][]byte) string {
	hexes := make([]string, len(vals))
	for i, v := range vals {
		hexes[i] = `\x` + hex.EncodeToString(v)
	}
	return textArrayLiteral(hexes)
}

func int32ArrayLiteral(vals []int32) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(int64(v), 10))
	}
	b.WriteByte('}')
	return b.String()
}

var defaultProducer = func() *Producer {
	p, err := NewProducer(Config{})
	if err != nil {
		panic(err)
	}
	return p
}()

// Emit writes ev into public.events_outbox within tx, with the default
// Config. See Producer.Emit.
func Emit(ctx context.Context, tx pgx.Tx, ev Event) (int64, error) {
	return defaultProducer.Emit(ctx, tx, ev)
}

// QueueEmit queues ev's insert into public.events_outbox on batch, with
// the default Config. See Producer.QueueEmit.
func QueueEmit(ctx context.Context, batch *pgx.Batch, ev Event) (*Queued, error) {
	return defaultProducer.QueueEmit(ctx, batch, ev)
}

// EmitBatch writes events into public.events_outbox within tx, with the
// default Config. See Producer.EmitBatch.
func EmitBatch(ctx context.Context, tx pgx.Tx, events []Event) ([]int64, error) {
	return defaultProducer.EmitBatch(ctx, tx, events)
}

// EmitSQL is Emit for a database/sql transaction.
func EmitSQL(ctx context.Context, tx *sql.Tx, ev Event) (int64, error) {
	return defaultProducer.EmitSQL(ctx, tx, ev)
}

// EmitBatchSQL is EmitBatch for a database/sql transaction.
func EmitBatchSQL(ctx context.Context, tx *sql.Tx, events []Event) ([]int64, error) {
	return defaultProducer.EmitBatchSQL(ctx, tx, events)
}
