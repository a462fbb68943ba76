package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
)

// Defaults of Common, applied by WithDefaults (so by both sources' New) and
// used by `outbox relay`'s flags.
const (
	DefaultBatchSize       = 5000
	DefaultMaxBatchBytes   = 4 << 20
	DefaultBackoffMin      = 100 * time.Millisecond
	DefaultBackoffMax      = 30 * time.Second
	DefaultShutdownTimeout = 30 * time.Second
)

// MaxBatchSize is the largest BatchSize a source accepts.
const MaxBatchSize = 100_000

// Source is a running source of events: the polling Relayer here, the WAL
// source in relay/walrelay. It reads committed events from the outbox and
// hands them to Common.Sink, reporting to Common.Hooks through an
// Observer.
type Source interface {
	// Run relays until ctx is cancelled, lets the batch in flight finish
	// (within Common.ShutdownTimeout) and returns nil; it returns an error
	// only when it cannot start or must not go on.
	Run(ctx context.Context) error
	// Stats returns the source's cumulative counters.
	Stats() Stats
}

// Common is the configuration every source shares; relay.Config and
// walrelay.Config embed it. Pool and Sink are required.
type Common struct {
	// Pool connects to the database holding the outbox. Required.
	Pool *pgxpool.Pool
	// Sink delivers batches to the broker and routes event types to its
	// destinations. Required.
	Sink Sink
	// Tables names the outbox table. Defaults to public.events_outbox.
	Tables outbox.Tables
	// TopicPrefix is prepended to the topic derived from each event type
	// (the Sink's Routing says how). It must match the producers'.
	// Defaults to "".
	TopicPrefix string
	// BatchSize is the most events one Publish call takes (for the polling
	// relay, one claim). Larger batches spread each batch's fixed costs
	// (for polling: the walks over the pending index, the commit's flush;
	// for both, the broker round trip) over more events; MaxBatchBytes
	// keeps large payloads from multiplying the memory this takes. At most
	// MaxBatchSize. Defaults to DefaultBatchSize (5000).
	BatchSize int
	// MaxBatchBytes bounds the bytes of one batch, which the source holds
	// in memory (about twice: the polling relay pipelines, the WAL source
	// reads ahead), so large payloads cannot multiply its footprint: a
	// batch stops before the event that would cross it (a single larger
	// event goes alone). An event counts as the source receives and
	// publishes it (payload and headers as JSON text, for polling also its
	// type), not the smaller size Postgres stores after compressing large
	// values. The database driver and the publisher's client buffer on top
	// of that. Defaults to DefaultMaxBatchBytes (4 MiB).
	MaxBatchBytes int
	// BackoffMin and BackoffMax bound the exponential backoff (with jitter)
	// after a failure: broker or database unreachable. Default to
	// DefaultBackoffMin (100ms) and DefaultBackoffMax (30s).
	BackoffMin, BackoffMax time.Duration
	// ShutdownTimeout bounds how long Run lets the batch in flight finish
	// after its context is cancelled; past it the batch is abandoned (the
	// polling relay rolls it back, the WAL source leaves it to the next
	// leader), to be sent again. Defaults to DefaultShutdownTimeout (30s).
	ShutdownTimeout time.Duration
	// SkipSchemaCheck skips the check, when Run starts, that the table's
	// schema is at the version this binary expects. Defaults to false.
	SkipSchemaCheck bool
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Hooks observe the source: each implements one or more of BatchHook,
	// PublishFailureHook and BatchErrorHook (monitor.Metrics implements them
	// all). They are called in this order. Defaults to none.
	Hooks []Hook
	// TracerProvider makes the source's spans: one "send <topic>" span
	// (kind producer, OpenTelemetry messaging conventions) per batch
	// published, linked to the span each event was emitted in. With a
	// provider that does not record (the default until an SDK is
	// installed) a batch costs one span start and nothing per event.
	// Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Contracts checks every event whose type has a contract (package
	// contracts: contracts.Load implements it) before it is sent, against
	// the version its event_version header names, or the type's latest
	// when it has none. An event that breaks it is refused with
	// ReasonContract, as an undecodable row is: the polling relay holds it
	// (its aggregate waits), the WAL source parks it. An event that passes
	// without an event_version header is sent with one: the version it
	// was checked against (CheckContract). Events of types without a
	// contract pass unchanged, unless the contracts require one for every
	// type. The relay reads the contracts when it starts: restart it after
	// changing them. Defaults to nil: no check.
	Contracts outbox.Contracts
	// Propagator reads the trace context Emit wrote into each event's
	// headers, for the publish span's links; it must read what the
	// producers' outbox.Config.Propagator writes. The headers themselves
	// are published unchanged. Defaults to propagation.TraceContext{}
	// (W3C Trace Context).
	Propagator propagation.TextMapPropagator
	// ExactlyOnce publishes each batch as one broker transaction that
	// also records the source's progress, so that no event is visible
	// twice to a reader of committed data through any crash of the
	// relayer, the database or the broker (docs/exactly-once.md). Sink
	// must be a TransactionalSink (kafkapub.TxPublisher). Defaults to
	// false: at-least-once delivery.
	ExactlyOnce bool
	// TransactionalID names the source's lanes (LaneID) with ExactlyOnce:
	// their transactional ids are "<TransactionalID>/<lane>". It must be
	// the same for every replica of one outbox and differ between
	// outboxes publishing to one broker cluster, and never change while
	// an outbox has events in flight. Defaults to
	// "outbox/<schema>.<table>"; set it when two databases publish
	// outboxes of the same name to one cluster.
	TransactionalID string
}

// WithDefaults returns c with its zero fields set to their defaults.
// Negative values are left for Validate to refuse.
func (c Common) WithDefaults() Common {
	c.Tables = c.Tables.WithDefaults()
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	for _, f := range []struct {
		d   *time.Duration
		def time.Duration
	}{
		{&c.BackoffMin, DefaultBackoffMin},
		{&c.BackoffMax, DefaultBackoffMax},
		{&c.ShutdownTimeout, DefaultShutdownTimeout},
	} {
		if *f.d == 0 {
			*f.d = f.def
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	if c.TransactionalID == "" {
		c.TransactionalID = "outbox/" + c.Tables.Schema + "." + c.Tables.Outbox
	}
	return c
}

// Routing is the Sink's routing for TopicPrefix, which a source fills
// each Message.Topic from; an error says why the prefix cannot start a
// destination name.
func (c Common) Routing() (outbox.Routing, error) {
	if c.Sink == nil {
		return nil, errors.New("relay: Config.Sink is nil; pass a sink, e.g. kafkapub.NewPublisher")
	}
	r, err := c.Sink.Routing(c.TopicPrefix)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	return r, nil
}

// Validate reports the first field of c (with its defaults applied) that
// no source can run with, saying what to set instead.
func (c Common) Validate() error {
	c = c.WithDefaults()
	if c.Pool == nil {
		return errors.New("relay: Config.Pool is nil; pass a *pgxpool.Pool connected to the outbox database")
	}
	if c.Sink == nil {
		return errors.New("relay: Config.Sink is nil; pass a sink, e.g. kafkapub.NewPublisher")
	}
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	if _, err := c.Routing(); err != nil {
		return err
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		return fmt.Errorf("relay: BatchSize is %d; use 1 to %d, or 0 for the default %d", c.BatchSize, MaxBatchSize, DefaultBatchSize)
	}
	if c.MaxBatchBytes < 1 {
		return fmt.Errorf("relay: MaxBatchBytes is %d; use a positive limit, or 0 for the default 4 MiB", c.MaxBatchBytes)
	}
	if err := positiveDurations(map[string]time.Duration{
		"BackoffMin": c.BackoffMin, "BackoffMax": c.BackoffMax, "ShutdownTimeout": c.ShutdownTimeout,
	}); err != nil {
		return err
	}
	if c.BackoffMax < c.BackoffMin {
		return fmt.Errorf("relay: BackoffMax (%s) is below BackoffMin (%s); raise BackoffMax or lower BackoffMin", c.BackoffMax, c.BackoffMin)
	}
	if c.ExactlyOnce {
		if _, err := c.transactional(); err != nil {
			return err
		}
		if len(c.TransactionalID) > MaxTransactionalIDLen {
			return fmt.Errorf("relay: TransactionalID is %d bytes; use at most %d (the lanes' ids add their names to it)", len(c.TransactionalID), MaxTransactionalIDLen)
		}
	}
	_, err := sortHooks(c.Hooks)
	return err
}

// MaxTransactionalIDLen bounds Common.TransactionalID.
const MaxTransactionalIDLen = 200

// positiveDurations refuses the first negative duration of fields (in
// name order, so that the message does not vary). 0 is accepted: it
// stands for the field's default.
func positiveDurations(fields map[string]time.Duration) error {
	names := make([]string, 0, len(fields))
	for n := range fields {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if d := fields[n]; d < 0 {
			return fmt.Errorf("relay: %s is %s; use a positive duration, or 0 for the default", n, d)
		}
	}
	return nil
}
