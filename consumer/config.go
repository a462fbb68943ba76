package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatopic"
	"github.com/pgoutbox/outbox/kafka"
)

// Defaults of Config, applied by WithDefaults (and so by New); `outbox
// consume` names them in its flags' help.
const (
	DefaultBatchSize       = 100
	DefaultConcurrency     = 1
	DefaultMaxAttempts     = 5
	DefaultMaxPollRecords  = 500
	DefaultBackoffMin      = 100 * time.Millisecond
	DefaultBackoffMax      = 5 * time.Second
	DefaultCommitInterval  = time.Second
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultDeadLetterSuffix makes a topic's dead-letter topic when
	// Config.DeadLetterTopic is nil: topic + ".dlq".
	DefaultDeadLetterSuffix = ".dlq"
)

// Limits of Config's sizes, which Validate enforces.
const (
	MaxBatchSize      = 10_000
	MaxMaxPollRecords = 100_000
	MaxConcurrency    = 1024
)

// Config configures a Consumer.
type Config struct {
	// Name is the consumer's name: events are deduplicated per name, and
	// it is the Kafka consumer group unless Group is set. Required.
	Name string
	// Pool connects to the database that holds the processed table and the
	// tables the handlers write. It needs at least Concurrency
	// connections, plus one for the checks that tell a database outage
	// from a failing handler. Required.
	Pool *pgxpool.Pool
	// Tables names the processed table. Defaults to public.processed_events.
	Tables outbox.Tables
	// Client says how to reach Kafka; Client.Opts are passed to franz-go
	// after the consumer's own options, so they win (the consumer fetches
	// at most 1 MiB a request to bound its memory: pass kgo.FetchMaxBytes
	// to change that). Brokers are required.
	Client kafka.ClientConfig
	// Topics to consume. Required.
	Topics []string
	// Group is the Kafka consumer group. Defaults to Name.
	Group string
	// Handlers maps an event type (the event_type header) to its handler.
	// Defaults to none; then DefaultHandler handles every type.
	Handlers map[string]Handler
	// DefaultHandler handles types missing from Handlers. Defaults to nil:
	// such records are dead-lettered as malformed. Handlers or
	// DefaultHandler must be set.
	DefaultHandler Handler
	// Middleware wraps every handler, the first outermost. Panics are
	// always recovered (see Recover). Defaults to none.
	Middleware []Middleware
	// MaxAttempts is how many times a failing handler runs for one record
	// before the record is dead-lettered. A handler error wrapped with
	// Permanent is dead-lettered after its first attempt. Database outages,
	// deadlocks and serialisation failures do not count: while the
	// database is unreachable, records wait. Defaults to
	// DefaultMaxAttempts (5).
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential backoff (with
	// jitter) between attempts. Default to DefaultBackoffMin (100ms) and
	// DefaultBackoffMax (5s).
	BackoffMin, BackoffMax time.Duration
	// DeadLetterTopic names the dead-letter topic of a topic. The topic
	// must exist or the broker must create topics on first use. Defaults
	// to topic + DefaultDeadLetterSuffix (".dlq").
	DeadLetterTopic func(topic string) string
	// BatchSize is how many consecutive records of one partition are
	// processed in one transaction (ProcessBatch). When a handler fails,
	// that batch is rolled back and its records are processed one by one.
	// 1 turns batching off. Defaults to DefaultBatchSize (100).
	BatchSize int
	// MaxPollRecords bounds how many records one poll takes. Rebalances
	// wait while a poll's records are processed, so this bounds how long a
	// rebalance waits. Defaults to DefaultMaxPollRecords (500).
	MaxPollRecords int
	// Concurrency is how many partitions are processed at once, each in
	// its own transactions. Records of one partition are always processed
	// in order. Raise it only when handlers of different partitions touch
	// different rows: two batches that update the same rows in different
	// orders deadlock, and Postgres takes deadlock_timeout (1s by default)
	// to notice. Defaults to DefaultConcurrency (1).
	Concurrency int
	// CommitInterval is how often offsets of done records are committed
	// while the rest of a poll is still being processed; a poll's offsets
	// are also committed when it is done. Defaults to
	// DefaultCommitInterval (1s).
	CommitInterval time.Duration
	// ShutdownTimeout bounds how long the transaction in flight may take
	// to finish after Run's context is cancelled; past it, it is rolled
	// back and its records are redelivered later. Defaults to
	// DefaultShutdownTimeout (10s).
	ShutdownTimeout time.Duration
	// SkipSchemaCheck skips the check, when Run starts, that the processed
	// table exists. Defaults to false.
	SkipSchemaCheck bool
	// Logger receives structured logs, and Client's broker connection
	// failures unless Client.Logger is set. Defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider makes the consumer's spans: every handler call runs
	// in a "process <topic>" span (kind consumer, OpenTelemetry messaging
	// conventions) whose parent is the trace context the record carries,
	// so the span Emit ran in and the handler's span are one trace; the
	// handler's ctx holds it, and a handler error is recorded on it.
	// Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from the record's headers; it
	// must read what the producers' outbox.Config.Propagator writes.
	// Defaults to propagation.TraceContext{} (W3C Trace Context).
	Propagator propagation.TextMapPropagator
}

// WithDefaults returns cfg with every zero field that has a default set to
// it (Tables excepted: the Processor defaults those). It does not
// validate: Validate does, and New calls both.
func (cfg Config) WithDefaults() Config {
	if cfg.Group == "" {
		cfg.Group = cfg.Name
	}
	if cfg.DeadLetterTopic == nil {
		cfg.DeadLetterTopic = func(topic string) string { return topic + DefaultDeadLetterSuffix }
	}
	setDefault(&cfg.MaxAttempts, DefaultMaxAttempts)
	setDefault(&cfg.BatchSize, DefaultBatchSize)
	setDefault(&cfg.MaxPollRecords, DefaultMaxPollRecords)
	setDefault(&cfg.Concurrency, DefaultConcurrency)
	setDefault(&cfg.BackoffMin, DefaultBackoffMin)
	setDefault(&cfg.BackoffMax, DefaultBackoffMax)
	setDefault(&cfg.CommitInterval, DefaultCommitInterval)
	setDefault(&cfg.ShutdownTimeout, DefaultShutdownTimeout)
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

// setDefault sets *v to def when it is zero. A negative value stays, for
// Validate to refuse.
func setDefault[T int | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// Validate checks a configuration that WithDefaults has completed, with
// an error that names the field and what to use instead. Name and Pool
// are checked by New (through the Processor).
func (cfg Config) Validate() error {
	_, err := cfg.deadLetters()
	if err != nil {
		return err
	}
	if err := checkHandlers(cfg.Handlers, cfg.DefaultHandler, cfg.Middleware); err != nil {
		return err
	}
	if err := checkRetry(cfg.MaxAttempts, cfg.BackoffMin, cfg.BackoffMax); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"ShutdownTimeout", cfg.ShutdownTimeout},
		{"CommitInterval", cfg.CommitInterval},
	} {
		if f.d < 0 {
			return fmt.Errorf("consumer: %s is %s; use a positive duration, or 0 for the default", f.name, f.d)
		}
	}
	return cfg.checkSizes()
}

// deadLetters checks Topics and returns the dead-letter topic of each,
// refusing one the consumer also reads.
func (cfg Config) deadLetters() (map[string]string, error) {
	if len(cfg.Topics) == 0 {
		return nil, errors.New("consumer: no Topics; list the topics to consume, e.g. \"order\" for events of type \"order.*\"")
	}
	seen := map[string]bool{}
	for _, t := range cfg.Topics {
		if err := kafkatopic.Validate(t); err != nil {
			return nil, fmt.Errorf("consumer: Topics holds %s", err)
		}
		if seen[t] {
			return nil, fmt.Errorf("consumer: topic %q is listed twice in Topics", t)
		}
		seen[t] = true
	}
	if cfg.DeadLetterTopic == nil {
		return nil, errors.New("consumer: DeadLetterTopic is nil; call WithDefaults first, or set it")
	}
	dlq := map[string]string{}
	for _, t := range cfg.Topics {
		d := cfg.DeadLetterTopic(t)
		if err := kafkatopic.Validate(d); err != nil {
			return nil, fmt.Errorf("consumer: the dead-letter topic of %q is %s", t, err)
		}
		if seen[d] {
			return nil, fmt.Errorf("consumer: the dead-letter topic of %q is %q, which this consumer also reads; dead letters would come back as input", t, d)
		}
		dlq[t] = d
	}
	return dlq, nil
}

// checkHandlers refuses a consumer with no handler, or a nil one.
func checkHandlers(handlers map[string]Handler, dflt Handler, middleware []Middleware) error {
	if len(handlers) == 0 && dflt == nil {
		return errors.New("consumer: no handlers; set Handlers (event type -> handler) or DefaultHandler")
	}
	for typ, h := range handlers {
		if h == nil {
			return fmt.Errorf("consumer: the handler for event type %q is nil", typ)
		}
	}
	for i, mw := range middleware {
		if mw == nil {
			return fmt.Errorf("consumer: Middleware[%d] is nil", i)
		}
	}
	return nil
}

// checkRetry refuses retry bounds that cannot work.
func checkRetry(maxAttempts int, backoffMin, backoffMax time.Duration) error {
	if maxAttempts < 0 {
		return fmt.Errorf("consumer: MaxAttempts is %d; use a positive number, or 0 for the default %d", maxAttempts, DefaultMaxAttempts)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"BackoffMin", backoffMin},
		{"BackoffMax", backoffMax},
	} {
		if f.d < 0 {
			return fmt.Errorf("consumer: %s is %s; use a positive duration, or 0 for the default", f.name, f.d)
		}
	}
	if backoffMax < backoffMin {
		return fmt.Errorf("consumer: BackoffMax (%s) is below BackoffMin (%s)", backoffMax, backoffMin)
	}
	return nil
}

func (cfg Config) checkSizes() error {
	for _, f := range []struct {
		name     string
		n        int
		def, max int
	}{
		{"BatchSize", cfg.BatchSize, DefaultBatchSize, MaxBatchSize},
		{"MaxPollRecords", cfg.MaxPollRecords, DefaultMaxPollRecords, MaxMaxPollRecords},
		{"Concurrency", cfg.Concurrency, DefaultConcurrency, MaxConcurrency},
	} {
		if f.n < 0 || f.n > f.max {
			return fmt.Errorf("consumer: %s is %d; use 1 to %d, or 0 for the default %d", f.name, f.n, f.max, f.def)
		}
	}
	return nil
}
