package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
)

// DispatcherConfig configures a Dispatcher: what every transport's
// consumer shares.
type DispatcherConfig struct {
	// Name is the consumer's name: events are deduplicated per name.
	// Required.
	Name string
	// Pool connects to the database that holds the processed table and
	// the tables the handlers write: one connection per message processed
	// at once, plus one for the checks that tell a database outage from a
	// failing handler. Required.
	Pool *pgxpool.Pool
	// Tables names the processed table. Defaults to public.processed_events.
	Tables outbox.Tables
	// Handlers maps an event type (the event_type header) to its handler.
	// Defaults to none; then DefaultHandler handles every type.
	Handlers map[string]Handler
	// DefaultHandler handles types missing from Handlers. Defaults to nil:
	// such messages are dead-lettered as malformed. Handlers or
	// DefaultHandler must be set.
	DefaultHandler Handler
	// Middleware wraps every handler, the first outermost. Panics are
	// always recovered (see Recover). Defaults to none.
	Middleware []Middleware
	// MaxAttempts is how many times a failing handler runs for one
	// message before it is dead-lettered. A handler error wrapped with
	// Permanent is dead-lettered after its first attempt. Database
	// outages, deadlocks and serialisation failures do not count: while
	// the database is unreachable, messages wait. Defaults to
	// DefaultMaxAttempts (5).
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential backoff (with
	// jitter) between attempts. Default to DefaultBackoffMin (100ms) and
	// DefaultBackoffMax (5s).
	BackoffMin, BackoffMax time.Duration
	// System names the messaging system in the spans'
	// messaging.system attribute: "nats", "rabbitmq", "redis", "webhook".
	// Defaults to DefaultSystem ("kafka").
	System string
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider makes the "process <topic>" spans (kind consumer)
	// every handler call runs in, whose parent is the trace context the
	// message carries. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from the message's headers; it
	// must read what the producers' outbox.Config.Propagator writes.
	// Defaults to propagation.TraceContext{} (W3C Trace Context).
	Propagator propagation.TextMapPropagator
}

// DefaultSystem is DispatcherConfig.System's default.
const DefaultSystem = "kafka"

// WithDefaults returns cfg with every zero field that has a default set
// to it (Tables excepted: the Processor defaults those).
func (cfg DispatcherConfig) WithDefaults() DispatcherConfig {
	setDefault(&cfg.MaxAttempts, DefaultMaxAttempts)
	setDefault(&cfg.BackoffMin, DefaultBackoffMin)
	setDefault(&cfg.BackoffMax, DefaultBackoffMax)
	if cfg.System == "" {
		cfg.System = DefaultSystem
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	return cfg
}

// Validate checks a configuration that WithDefaults has completed, with
// an error that names the field and what to use instead. Name and Pool
// are checked by NewDispatcher (through the Processor).
func (cfg DispatcherConfig) Validate() error {
	if err := checkHandlers(cfg.Handlers, cfg.DefaultHandler, cfg.Middleware); err != nil {
		return err
	}
	return checkRetry(cfg.MaxAttempts, cfg.BackoffMin, cfg.BackoffMax)
}

// Delivery is one message as a transport received it, before it is an
// Event.
type Delivery struct {
	// Topic is where the message came from (a subject, a queue, a
	// stream, an endpoint's path): Event.Topic, and the spans' and logs'
	// destination.
	Topic string
	// Key is the aggregate id in its text form, as the transport carries
	// it (the aggregate_id header on sinks without a record key); "" when
	// it has none. A key that is not a UUID leaves Event.AggregateID nil.
	Key string
	// Payload is the message's body: the event's JSON, or its bytes in
	// the format of the content-type header.
	Payload []byte
	// Headers are the message's headers: event_id, event_type,
	// event_source and content-type among them (a transport that carries
	// the content type as a property puts it here under content-type). A transport whose messages can repeat a
	// header keeps the first value of a reserved one
	// (outbox.IsReservedHeader), the relayer's.
	Headers map[string]string
}

// Verdict is what a transport does with a message once the Dispatcher is
// done with it.
type Verdict int

const (
	// Stopped: the stop context ended before the message was settled.
	// Leave it unacknowledged: it is redelivered later.
	Stopped Verdict = iota
	// Done: processed now, or before (a duplicate). Acknowledge it.
	Done
	// DeadLetter: it can never be processed as it is (malformed, refused
	// by the processed table, or its handler failed MaxAttempts times,
	// or once with a Permanent error). Write it to the transport's
	// dead-letter place with Result.Reason, then acknowledge it; it is
	// not recorded as processed, so once replayed it is processed then.
	DeadLetter
)

func (v Verdict) String() string {
	switch v {
	case Done:
		return "done"
	case DeadLetter:
		return "dead_letter"
	}
	return "stopped"
}

// Result is the Dispatcher's verdict on one message.
type Result struct {
	Verdict Verdict
	// Event is the message as decoded; for a malformed one, what could be
	// read of it.
	Event Event
	// Outcome is Processed or Duplicate when Verdict is Done.
	Outcome Outcome
	// Reason says why, when Verdict is DeadLetter: what is malformed, or
	// the handler's last error.
	Reason string
	// Malformed is set when the message never reached a handler: it
	// cannot be decoded, or no handler takes its type.
	Malformed bool
	// Attempts is how many times the handler ran.
	Attempts int
}

// DispatcherStats are cumulative counters since the Dispatcher was made.
type DispatcherStats struct {
	// Processed events: their handler ran and committed.
	Processed int64
	// Duplicates: already processed by this consumer name; skipped.
	Duplicates int64
	// Malformed messages, dead-lettered without reaching a handler.
	Malformed int64
	// DeadLettered messages, Malformed ones included.
	DeadLettered int64
	// Retries: a message tried again after its handler failed, lost a
	// deadlock, or the database was unreachable.
	Retries int64
}

// Dispatcher is the part of a consumer that knows nothing of its
// transport: it decodes a message into an Event, routes it to its handler,
// runs the handler through the Processor (dedupe and effects in one
// transaction) in a "process <topic>" span, retries a failing handler with
// backoff, waits out a database outage without counting it against the
// message, and gives the transport its Verdict. A transport built on it
// acknowledges a message only after Dispatch returns Done or, having
// dead-lettered it, DeadLetter: then nothing is lost and nothing is
// applied twice. It is safe for concurrent use; messages of one aggregate
// must be dispatched one after the other, in order, for their effects to
// keep that order.
type Dispatcher struct {
	cfg      DispatcherConfig
	proc     *Processor
	log      *slog.Logger
	handlers map[string]Handler
	dflt     Handler
	tracing  tracing

	malformed, deadLettered, retries atomic.Int64
}

// NewDispatcher validates cfg and applies its defaults.
func NewDispatcher(cfg DispatcherConfig) (*Dispatcher, error) {
	proc, err := NewProcessor(ProcessorConfig{Name: cfg.Name, Pool: cfg.Pool, Tables: cfg.Tables})
	if err != nil {
		return nil, err
	}
	return newDispatcher(proc, cfg)
}

// newDispatcher is NewDispatcher on a Processor made from cfg.
func newDispatcher(proc *Processor, cfg DispatcherConfig) (*Dispatcher, error) {
	cfg.Tables = proc.Config().Tables
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Dispatcher{
		cfg:      cfg,
		proc:     proc,
		log:      cfg.Logger.With("consumer", cfg.Name),
		handlers: make(map[string]Handler, len(cfg.Handlers)),
		tracing:  tracing{tracer: cfg.TracerProvider.Tracer(tracerName), prop: cfg.Propagator, system: cfg.System, group: cfg.Name},
	}
	for typ, h := range cfg.Handlers {
		d.handlers[typ] = Chain(h, cfg.Middleware...)
	}
	if cfg.DefaultHandler != nil {
		d.dflt = Chain(cfg.DefaultHandler, cfg.Middleware...)
	}
	return d, nil
}

// Config returns the configuration with defaults applied.
func (d *Dispatcher) Config() DispatcherConfig { return d.cfg }

// Processor returns the processing core the Dispatcher runs handlers on.
func (d *Dispatcher) Processor() *Processor { return d.proc }

// Check checks that the processed table exists, with an error that says
// to migrate when it does not. Run it when the transport starts.
func (d *Dispatcher) Check(ctx context.Context) error { return d.proc.Check(ctx) }

// Stats returns the cumulative counters.
func (d *Dispatcher) Stats() DispatcherStats {
	ps := d.proc.Stats()
	return DispatcherStats{Processed: ps.Processed, Duplicates: ps.Duplicates, Malformed: d.malformed.Load(),
		DeadLettered: d.deadLettered.Load(), Retries: d.retries.Load()}
}

// Decode turns m into an Event, or says why it cannot be processed: the
// error is a *MalformedError, and a transport dead-letters such a message
// at once. A type with no handler is malformed too.
func (d *Dispatcher) Decode(m Delivery) (Event, error) {
	ev := Event{Topic: m.Topic, Payload: m.Payload, Headers: m.Headers}
	if ev.Headers == nil {
		ev.Headers = map[string]string{}
	}
	ev, bad := decodeEvent(ev, m.Key)
	if bad == nil {
		bad = d.route(ev)
	}
	if bad != nil {
		return ev, bad
	}
	return ev, nil
}

// route says why ev has no handler, or returns nil.
func (d *Dispatcher) route(ev Event) *MalformedError {
	if _, ok := d.handlers[ev.Type]; !ok && d.dflt == nil {
		return &MalformedError{Reason: fmt.Sprintf("no handler for event type %q and no default handler", ev.Type)}
	}
	return nil
}

// Dispatch decodes m and processes it until it is settled: Done, or
// DeadLetter, or Stopped once stop ends. work is the context the
// handler's transaction runs in: cancel stop first, and work only after a
// grace period, so that the transaction in flight may commit.
func (d *Dispatcher) Dispatch(stop, work context.Context, m Delivery) Result {
	ev, err := d.Decode(m)
	if err != nil {
		d.malformed.Add(1)
		d.deadLettered.Add(1)
		d.log.Error("malformed message; dead-lettering it", "topic", m.Topic, "err", err)
		return Result{Verdict: DeadLetter, Event: ev, Reason: err.Error(), Malformed: true}
	}
	res := d.process(stop, work, ev, d.log.With("topic", m.Topic), nil)
	if res.Verdict == DeadLetter {
		d.deadLettered.Add(1)
	}
	return res
}

// process runs ev's handler with retries (see Dispatch). log carries
// where the event came from; prior, when set, is its failure in a batch:
// its first attempt.
func (d *Dispatcher) process(stop, work context.Context, ev Event, log *slog.Logger, prior *HandlerError) Result {
	res := Result{Event: ev}
	outages := 0
	var err error
	if prior != nil {
		err = prior
	}
	for stop.Err() == nil {
		if err == nil {
			if res.Outcome, err = d.proc.Process(work, ev, d.handle); err == nil {
				res.Verdict = Done
				return res
			}
		}
		if work.Err() != nil {
			return Result{Event: ev}
		}
		blame := classify(err)
		if blame == theRecord {
			log.Error("the processed table refuses the event; dead-lettering it", "event_id", ev.ID, "err", err)
			res.Verdict, res.Reason = DeadLetter, err.Error()
			return res
		}
		if blame == notTheEvent || d.cfg.Pool.Ping(work) != nil {
			// The database failed, not the handler (or the handler failed
			// because the database is gone, or lost a deadlock or
			// serialisation conflict with another transaction): nothing is
			// wrong with the event, so wait and retry without counting an
			// attempt.
			outages++
			if !d.wait(stop, log, outages, "processing failed, not for the event's fault; retrying", "err", err, "event_id", ev.ID) {
				return Result{Event: ev}
			}
			err = nil
			continue
		}
		var he *HandlerError
		if !errors.As(err, &he) { // the commit refused the handler's writes
			he = &HandlerError{Source: ev.Source, EventID: ev.ID, Err: err}
		}
		res.Attempts++
		elog := log.With("event_id", ev.ID, "event_type", ev.Type, "attempt", res.Attempts)
		if IsPermanent(err) || res.Attempts >= d.cfg.MaxAttempts {
			var pe *PanicError
			if errors.As(err, &pe) {
				elog = elog.With("stack", string(pe.Stack))
			}
			elog.Error("handler failed; dead-lettering the event", "err", he.Err)
			res.Verdict, res.Reason = DeadLetter, he.Err.Error()
			return res
		}
		if !d.wait(stop, elog, res.Attempts, "handler failed; retrying", "err", he.Err) {
			return Result{Event: ev}
		}
		err = nil
	}
	return Result{Event: ev}
}

// wait counts a retry, logs it with the delay of the n-th one, and sleeps
// that long; false when stop ended first.
func (d *Dispatcher) wait(stop context.Context, log *slog.Logger, n int, msg string, args ...any) bool {
	d.retries.Add(1)
	delay := backoff.Delay(d.cfg.BackoffMin, d.cfg.BackoffMax, n)
	log.Warn(msg, append(args, "retry_in", delay.Round(time.Millisecond))...)
	return backoff.Sleep(stop, delay)
}

// handle routes an event to its handler (Decode has made sure one exists)
// and runs it in a "process <topic>" span (kind consumer) whose parent is
// the trace context the message carries: the span Emit ran in, so
// producer and handler are one trace. The handler's ctx holds the span. A
// panic is recovered here, as Recover does, so the span records it.
func (d *Dispatcher) handle(ctx context.Context, tx pgx.Tx, ev Event) (err error) {
	h, ok := d.handlers[ev.Type]
	if !ok {
		h = d.dflt
	}
	ctx, span := d.tracing.startProcess(ctx, ev)
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
		endProcess(span, err)
	}()
	return h(ctx, tx, ev)
}
