package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtext"
)

// Outcome says what processing did with an event.
type Outcome int

const (
	// Processed: the handler ran and its effects committed with the
	// dedupe row.
	Processed Outcome = iota + 1
	// Duplicate: this consumer had already processed the event; the
	// handler did not run.
	Duplicate
)

func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// ErrInvalidEvent is returned, wrapped, for an event that cannot be
// deduplicated: an id that is not positive, or a (source, id) the
// processed table refuses to store, such as a source that is not valid
// UTF-8 or too long to index (the *pgconn.PgError is wrapped too). Retrying
// such an event fails the same way. From ProcessBatch it means that at
// least one of the events is invalid: process them one by one to find it.
var ErrInvalidEvent = errors.New("consumer: invalid event")

// HandlerError is returned by Process and ProcessBatch when a handler
// failed (returned an error or panicked), as opposed to the database. The
// transaction was rolled back: neither the effects nor the dedupe row were
// kept, so the event can be retried.
type HandlerError struct {
	// Index is the failed event's position in the batch; 0 for Process,
	// -1 for a BatchHandler (then Source and EventID are empty).
	Index   int
	Source  string
	EventID int64
	Err     error
}

func (e *HandlerError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("batch handler failed: %v", e.Err)
	}
	if e.Source != "" {
		return fmt.Sprintf("handler failed on event %d from %q: %v", e.EventID, e.Source, e.Err)
	}
	return fmt.Sprintf("handler failed on event %d: %v", e.EventID, e.Err)
}

func (e *HandlerError) Unwrap() error { return e.Err }

// ProcessorConfig configures a Processor.
type ProcessorConfig struct {
	// Name is the consumer's name: each name processes each event once.
	// Two services that both react to an event use two names. Required.
	Name string
	// Pool connects to the database that holds the processed table and
	// the tables the handlers write. Required.
	Pool *pgxpool.Pool
	// Tables names the processed table (Tables.Processed in
	// Tables.Schema). Defaults to public.processed_events.
	Tables outbox.Tables
	// TxOptions are the processing transaction's options. Defaults to the
	// server's defaults (read committed, read write).
	TxOptions pgx.TxOptions
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg ProcessorConfig) WithDefaults() ProcessorConfig {
	cfg.Tables = cfg.Tables.WithDefaults()
	return cfg
}

// Validate reports the first field of cfg that a Processor cannot use,
// saying what to set instead.
func (cfg ProcessorConfig) Validate() error {
	if strings.TrimSpace(cfg.Name) == "" {
		return errors.New("consumer: Name is empty; name the consumer, e.g. \"loyalty\": events are deduplicated per name")
	}
	if why := pgtext.Invalid(cfg.Name); why != "" {
		// Else the processed table would refuse every event, and each
		// would be dead-lettered as invalid.
		return fmt.Errorf("consumer: Name %q %s; it is stored in a text column", cfg.Name, why)
	}
	if cfg.Pool == nil {
		return errors.New("consumer: Pool is nil; pass a *pgxpool.Pool connected to the database the handlers write to")
	}
	return cfg.Tables.Validate()
}

// ProcessorStats are cumulative counters since the Processor was created.
type ProcessorStats struct {
	// Processed events: handler ran and committed.
	Processed int64
	// Duplicates skipped because the event was already processed.
	Duplicates int64
	// HandlerErrors: calls that failed in a handler and rolled back.
	HandlerErrors int64
}

// Processor is the transport-agnostic idempotent processing core. It is
// safe for concurrent use.
type Processor struct {
	cfg        ProcessorConfig
	table      string
	insertOne  string
	insertMany string

	processed, duplicates, handlerErrors atomic.Int64
}

// NewProcessor applies cfg's defaults and validates it.
func NewProcessor(cfg ProcessorConfig) (*Processor, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	table := cfg.Tables.ProcessedIdent()
	return &Processor{
		cfg:        cfg,
		table:      table,
		insertOne:  render(insertOneSQL, cfg.Tables),
		insertMany: render(insertManySQL, cfg.Tables),
	}, nil
}

// Config returns the configuration with defaults applied.
func (p *Processor) Config() ProcessorConfig { return p.cfg }

// Stats returns the cumulative counters.
func (p *Processor) Stats() ProcessorStats {
	return ProcessorStats{Processed: p.processed.Load(), Duplicates: p.duplicates.Load(), HandlerErrors: p.handlerErrors.Load()}
}

// Check verifies that the processed table exists with the columns this
// version needs, with an error that says how to fix it.
func (p *Processor) Check(ctx context.Context) error {
	_, err := p.cfg.Pool.Exec(ctx, render(checkSQL, p.cfg.Tables))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "3F000") {
		return fmt.Errorf("consumer: processed table %s is missing or out of date (%s); run 'outbox migrate up' against the consumer's database (with the --schema and --processed-table the consumer uses)", p.table, pgErr.Message)
	}
	if err != nil {
		return fmt.Errorf("consumer: check processed table %s: %w", p.table, err)
	}
	return nil
}

func validate(ev Event) error {
	if ev.ID <= 0 {
		return fmt.Errorf("%w: event id is %d; ids are positive (the outbox row's id)", ErrInvalidEvent, ev.ID)
	}
	return nil
}

// Process handles one event exactly once for this consumer: in one
// transaction it records (consumer, source, event id) as processed and, if
// that row is new, runs h with the same transaction, then commits. If the
// row existed the event is a Duplicate and h does not run. If h fails, the
// transaction rolls back, the dedupe row with it, and the error is a
// *HandlerError. A panic in h is recovered as a *PanicError.
func (p *Processor) Process(ctx context.Context, ev Event, h Handler) (Outcome, error) {
	if err := validate(ev); err != nil {
		return 0, err
	}
	if h == nil {
		return 0, errors.New("consumer: Process called with a nil handler")
	}
	tx, err := p.cfg.Pool.BeginTx(ctx, p.cfg.TxOptions)
	if err != nil {
		return 0, fmt.Errorf("consumer: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	tag, err := tx.Exec(ctx, p.insertOne, p.cfg.Name, ev.Source, ev.ID)
	if err != nil {
		return 0, recordError(err, fmt.Sprintf("event %d", ev.ID), p.table)
	}
	if tag.RowsAffected() == 0 {
		if err := tx.Commit(ctx); err != nil {
			return 0, fmt.Errorf("consumer: commit: %w", err)
		}
		p.duplicates.Add(1)
		return Duplicate, nil
	}
	if err := Recover()(h)(ctx, tx, ev); err != nil {
		p.handlerErrors.Add(1)
		return 0, &HandlerError{Source: ev.Source, EventID: ev.ID, Err: err}
	}
	if err := tx.Commit(ctx); err != nil {
		// The commit's fate is unknown when the connection dropped; a retry
		// finds out, as a Duplicate if it did commit.
		return 0, fmt.Errorf("consumer: commit event %d: %w", ev.ID, err)
	}
	p.processed.Add(1)
	return Processed, nil
}

// ProcessBatch is Process for many events in one transaction: one
// statement records them all, h runs for each new one in input order, one
// commit. An event that appears twice in the batch runs once (the second
// copy is a Duplicate). Outcomes are in input order.
//
// If any handler fails, the whole batch rolls back and the error is a
// *HandlerError whose Index says which event failed; nothing was recorded.
// Fall back to Process, one event at a time, so the events before and after
// it succeed and the failing one can be retried or dead-lettered alone.
func (p *Processor) ProcessBatch(ctx context.Context, evs []Event, h Handler) ([]Outcome, error) {
	if h == nil {
		return nil, errors.New("consumer: ProcessBatch called with a nil handler")
	}
	h = Recover()(h)
	return p.processBatch(ctx, evs, func(ctx context.Context, tx pgx.Tx, fresh []Event, at []int) error {
		for j, ev := range fresh {
			if err := h(ctx, tx, ev); err != nil {
				return &HandlerError{Index: at[j], Source: ev.Source, EventID: ev.ID, Err: err}
			}
		}
		return nil
	})
}

// BatchHandler applies the side effects of many events at once in tx, for
// instance with one INSERT ... SELECT FROM unnest(...): a round trip for the
// batch instead of one per event. It receives only the events this consumer
// has not processed before, in the batch's order.
type BatchHandler func(ctx context.Context, tx pgx.Tx, evs []Event) error

// ProcessBatchFunc is ProcessBatch with a BatchHandler. If the handler
// fails (or panics), the whole batch rolls back and the error is a
// *HandlerError whose Index is -1 and EventID 0: it names no single event.
func (p *Processor) ProcessBatchFunc(ctx context.Context, evs []Event, h BatchHandler) ([]Outcome, error) {
	if h == nil {
		return nil, errors.New("consumer: ProcessBatchFunc called with a nil handler")
	}
	return p.processBatch(ctx, evs, func(ctx context.Context, tx pgx.Tx, fresh []Event, _ []int) (err error) {
		if len(fresh) == 0 {
			return nil
		}
		defer func() {
			if r := recover(); r != nil {
				err = &HandlerError{Index: -1, Err: &PanicError{Value: r, Stack: debug.Stack()}}
			}
		}()
		if err := h(ctx, tx, fresh); err != nil {
			return &HandlerError{Index: -1, Err: err}
		}
		return nil
	})
}

// processBatch records evs in the processed table and runs apply on the
// fresh ones (with their positions in evs) in the same transaction.
func (p *Processor) processBatch(ctx context.Context, evs []Event, apply func(ctx context.Context, tx pgx.Tx, fresh []Event, at []int) error) ([]Outcome, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	type key struct {
		source string
		id     int64
	}
	keys := make([]key, 0, len(evs))
	for i, ev := range evs {
		if err := validate(ev); err != nil {
			return nil, fmt.Errorf("event %d of %d: %w", i, len(evs), err)
		}
		keys = append(keys, key{ev.Source, ev.ID})
	}
	// Insert in key order, so two batches that overlap lock the same rows
	// in the same order and cannot deadlock on each other.
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(strings.Compare(a.source, b.source), cmp.Compare(a.id, b.id))
	})
	keys = slices.Compact(keys)
	sources := make([]string, len(keys))
	ids := make([]int64, len(keys))
	for i, k := range keys {
		sources[i], ids[i] = k.source, k.id
	}

	tx, err := p.cfg.Pool.BeginTx(ctx, p.cfg.TxOptions)
	if err != nil {
		return nil, fmt.Errorf("consumer: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	rows, err := tx.Query(ctx, p.insertMany, p.cfg.Name, sources, ids)
	if err != nil {
		return nil, recordError(err, fmt.Sprintf("%d events", len(keys)), p.table)
	}
	fresh := make(map[key]bool, len(keys))
	var k key
	_, err = pgx.ForEachRow(rows, []any{&k.source, &k.id}, func() error {
		fresh[k] = true
		return nil
	})
	if err != nil {
		return nil, recordError(err, fmt.Sprintf("%d events", len(keys)), p.table)
	}

	out := make([]Outcome, len(evs))
	freshEvs := make([]Event, 0, len(fresh))
	at := make([]int, 0, len(fresh))
	var duplicates int64
	for i, ev := range evs {
		k := key{ev.Source, ev.ID}
		if !fresh[k] {
			out[i] = Duplicate
			duplicates++
			continue
		}
		delete(fresh, k) // a second copy in this batch is a duplicate
		out[i] = Processed
		freshEvs = append(freshEvs, ev)
		at = append(at, i)
	}
	if err := apply(ctx, tx, freshEvs, at); err != nil {
		p.handlerErrors.Add(1)
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("consumer: commit batch of %d events: %w", len(evs), err)
	}
	p.processed.Add(int64(len(freshEvs)))
	p.duplicates.Add(duplicates)
	return out, nil
}
