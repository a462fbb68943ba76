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
	"github.com/pgoutbox/outbox/kafka"
)

// Defaults of Config that `outbox consume` names in its flags' help.
const (
	DefaultBatchSize   = 100
	DefaultConcurrency = 1
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
	// database is unreachable, records wait. Defaults to 5.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential backoff (with
	// jitter) between attempts. Default to 100ms and 5s.
	BackoffMin, BackoffMax time.Duration
	// DeadLetterTopic names the dead-letter topic of a topic. The topic
	// must exist or the broker must create topics on first use. Defaults
	// to topic + ".dlq".
	DeadLetterTopic func(topic string) string
	// BatchSize is how many consecutive records of one partition are
	// processed in one transaction (ProcessBatch). When a handler fails,
	// that batch is rolled back and its records are processed one by one.
	// 1 turns batching off. Defaults to DefaultBatchSize (100).
	BatchSize int
	// MaxPollRecords bounds how many records one poll takes. Rebalances
	// wait while a poll's records are processed, so this bounds how long a
	// rebalance waits. Defaults to 500.
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
	// are also committed when it is done. Defaults to 1s.
	CommitInterval time.Duration
	// ShutdownTimeout bounds how long the transaction in flight may take
	// to finish after Run's context is cancelled; past it, it is rolled
	// back and its records are redelivered later. Defaults to 10s.
	ShutdownTimeout time.Duration
	// SkipSchemaCheck skips the check, when Run starts, that the processed
	// table exists. Defaults to false.
	SkipSchemaCheck bool
	// Logger receives structured logs, and Client's broker connection
	// failures unless Client.Logger is set. Defaults to slog.Default().
	Logger *slog.Logger
	// BeforeCommit, if set, is called with the offsets about to be
	// committed (topic -> partition -> next offset to read), after the
	// transactions that processed those records committed. Returning an
	// error stops the consumer without committing them: Run returns the
	// error. It exists for tests that simulate a crash between the
	// database commit and the offset commit, and for instrumentation.
	// Called from the consumer's goroutines, one call at a time. Defaults
	// to nil.
	BeforeCommit func(offsets map[string]map[int32]int64) error
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

// applyDefaults validates cfg and applies its defaults, Tables excepted (the
// Processor applies those). It returns the dead-letter topic of each topic.
func (cfg *Config) applyDefaults() (map[string]string, error) {
	seen, err := cfg.checkTopics()
	if err != nil {
		return nil, err
	}
	if cfg.Group == "" {
		cfg.Group = cfg.Name
	}
	if err := cfg.checkHandlers(); err != nil {
		return nil, err
	}
	dlq, err := cfg.deadLetterTopics(seen)
	if err != nil {
		return nil, err
	}
	if err := cfg.retryDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.sizeDefaults(); err != nil {
		return nil, err
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
	return dlq, nil
}

// checkTopics checks Topics and returns them as a set.
func (cfg *Config) checkTopics() (map[string]bool, error) {
	if len(cfg.Topics) == 0 {
		return nil, errors.New("consumer: no Topics; list the topics to consume, e.g. \"order\" for events of type \"order.*\"")
	}
	seen := map[string]bool{}
	for _, t := range cfg.Topics {
		if err := outbox.ValidateTopic(t); err != nil {
			return nil, fmt.Errorf("consumer: Topics holds %s", err)
		}
		if seen[t] {
			return nil, fmt.Errorf("consumer: topic %q is listed twice in Topics", t)
		}
		seen[t] = true
	}
	return seen, nil
}

func (cfg *Config) checkHandlers() error {
	if len(cfg.Handlers) == 0 && cfg.DefaultHandler == nil {
		return errors.New("consumer: no handlers; set Handlers (event type -> handler) or DefaultHandler")
	}
	for typ, h := range cfg.Handlers {
		if h == nil {
			return fmt.Errorf("consumer: the handler for event type %q is nil", typ)
		}
	}
	for i, mw := range cfg.Middleware {
		if mw == nil {
			return fmt.Errorf("consumer: Middleware[%d] is nil", i)
		}
	}
	return nil
}

// deadLetterTopics defaults DeadLetterTopic and returns the dead-letter
// topic of each topic, refusing one the consumer also reads (topics).
func (cfg *Config) deadLetterTopics(topics map[string]bool) (map[string]string, error) {
	if cfg.DeadLetterTopic == nil {
		cfg.DeadLetterTopic = func(topic string) string { return topic + ".dlq" }
	}
	dlq := map[string]string{}
	for _, t := range cfg.Topics {
		d := cfg.DeadLetterTopic(t)
		if err := outbox.ValidateTopic(d); err != nil {
			return nil, fmt.Errorf("consumer: the dead-letter topic of %q is %s", t, err)
		}
		if topics[d] {
			return nil, fmt.Errorf("consumer: the dead-letter topic of %q is %q, which this consumer also reads; dead letters would come back as input", t, d)
		}
		dlq[t] = d
	}
	return dlq, nil
}

// retryDefaults checks and defaults MaxAttempts and the durations.
func (cfg *Config) retryDefaults() error {
	if cfg.MaxAttempts < 0 {
		return fmt.Errorf("consumer: MaxAttempts is %d; use a positive number, or 0 for the default 5", cfg.MaxAttempts)
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 5
	}
	for _, f := range []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"BackoffMin", &cfg.BackoffMin, 100 * time.Millisecond},
		{"BackoffMax", &cfg.BackoffMax, 5 * time.Second},
		{"ShutdownTimeout", &cfg.ShutdownTimeout, 10 * time.Second},
		{"CommitInterval", &cfg.CommitInterval, time.Second},
	} {
		if *f.d < 0 {
			return fmt.Errorf("consumer: %s is %s; use a positive duration, or 0 for the default", f.name, *f.d)
		}
		if *f.d == 0 {
			*f.d = f.def
		}
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		return fmt.Errorf("consumer: BackoffMax (%s) is below BackoffMin (%s)", cfg.BackoffMax, cfg.BackoffMin)
	}
	return nil
}

// sizeDefaults checks and defaults BatchSize, MaxPollRecords and
// Concurrency.
func (cfg *Config) sizeDefaults() error {
	for _, f := range []struct {
		name     string
		n        *int
		def, max int
	}{
		{"BatchSize", &cfg.BatchSize, DefaultBatchSize, 10_000},
		{"MaxPollRecords", &cfg.MaxPollRecords, 500, 100_000},
		{"Concurrency", &cfg.Concurrency, DefaultConcurrency, 1024},
	} {
		if *f.n < 0 || *f.n > f.max {
			return fmt.Errorf("consumer: %s is %d; use 1 to %d, or 0 for the default %d", f.name, *f.n, f.max, f.def)
		}
		if *f.n == 0 {
			*f.n = f.def
		}
	}
	return nil
}
