// Command watermill drains a Postgres outbox through the Watermill
// forwarder (watermill-sql v4 + watermill-kafka v3) to Kafka and prints
// events/s: the comparison point of `outbox bench relay --watermill`. It is
// its own Go module so the outbox library never depends on Watermill.
//
//	cd bench/watermill && go run . --events 50000
//
// It creates a private schema, preloads the events through Watermill's own
// forwarder publisher (an enveloped message per event, as an application
// would write them), starts the forwarder with the settings Watermill's docs
// give for throughput (SubscribeBatchSize 1,000, PollInterval 10 ms; --defaults
// uses Watermill's defaults instead), and times it until every event has been
// acknowledged by the broker. The broker is an in-process dev broker (the same
// one the outbox bench uses) unless --brokers is given. The partition key is
// the event's aggregate id, as the outbox relay does.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
)

const (
	forwarderTopic = "outbox"
	destTopic      = "order"
)

// Result is the line printed with --json.
type Result struct {
	Events     int64   `json:"events"`
	Published  int64   `json:"published"`
	Seconds    float64 `json:"seconds"`
	EventsPerS float64 `json:"events_per_s"`
	BatchSize  int     `json:"batch_size"`
	PollMS     float64 `json:"poll_ms"`
	Watermill  string  `json:"watermill"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "watermill bench: "+err.Error())
		os.Exit(1)
	}
}

func run() error {
	var (
		dbURL    = flag.String("database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "Postgres connection string; env DATABASE_URL")
		brokers  = flag.String("brokers", "", "Kafka brokers host:port,...; default: an in-process dev broker")
		events   = flag.Int("events", 50_000, "events to preload and drain")
		aggs     = flag.Int("aggregates", 1_000, "aggregates the events spread over (the partition key)")
		batch    = flag.Int("batch", 1000, "SubscribeBatchSize")
		poll     = flag.Duration("poll", 10*time.Millisecond, "subscriber PollInterval")
		defaults = flag.Bool("defaults", false, "use Watermill's defaults (batch 100, poll 1s) instead of --batch/--poll")
		asJSON   = flag.Bool("json", false, "print the result as one JSON line")
		timeout  = flag.Duration("timeout", 10*time.Minute, "give up when the drain takes longer")
	)
	flag.Parse()
	if *events < 1 || *aggs < 1 {
		return errors.New("--events and --aggregates must be positive")
	}
	if *defaults {
		*batch, *poll = 100, time.Second
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// Progress goes to stderr; stdout carries only the result.
	log := os.Stderr

	pool, schema, drop, err := privateSchema(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer drop()

	addrs := splitBrokers(*brokers)
	if len(addrs) == 0 {
		b, err := devkafka.Start(devkafka.Config{Partitions: 6})
		if err != nil {
			return err
		}
		defer b.Close()
		addrs = []string{b.Addr()}
	}

	// Shutdown makes the subscriber log its cancelled query as an error;
	// the level goes up before Close so only real failures show.
	var level slog.LevelVar
	level.Set(slog.LevelWarn)
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: &level})))
	db := wsql.BeginnerFromPgx(pool)
	schemaAdapter := wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: *batch}

	sqlPub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, logger)
	if err != nil {
		return err
	}
	outboxPub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic})
	fmt.Fprintf(log, "watermill bench: preloading %d events into %s.watermill_%s\n", *events, schema, forwarderTopic)
	if err := preload(outboxPub, *events, *aggs); err != nil {
		return err
	}

	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		PollInterval:     *poll,
		SchemaAdapter:    schemaAdapter,
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, logger)
	if err != nil {
		return err
	}
	kafkaPub, err := wkafka.NewPublisher(wkafka.PublisherConfig{
		Brokers: addrs,
		Marshaler: wkafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return m.Metadata.Get("aggregate_id"), nil
		}),
	}, logger)
	if err != nil {
		return err
	}
	defer kafkaPub.Close()

	var forwarded atomic.Int64
	var lastAt atomic.Int64
	fwd, err := forwarder.NewForwarder(sub, kafkaPub, logger, forwarder.Config{
		ForwarderTopic: forwarderTopic,
		Middlewares: []message.HandlerMiddleware{func(h message.HandlerFunc) message.HandlerFunc {
			return func(m *message.Message) ([]*message.Message, error) {
				out, err := h(m)
				if err == nil {
					forwarded.Add(1)
					lastAt.Store(time.Now().UnixNano())
				}
				return out, err
			}
		}},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "watermill bench: forwarding (batch %d, poll %s) to %s\n", *batch, *poll, strings.Join(addrs, ","))
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(ctx) }()
	deadline := time.After(*timeout)
	want := int64(*events)
	for forwarded.Load() < want {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-runErr:
			return fmt.Errorf("forwarder stopped: %v", err)
		case <-deadline:
			return fmt.Errorf("forwarded %d of %d events within %s", forwarded.Load(), want, *timeout)
		case <-time.After(2 * time.Millisecond):
		}
	}
	elapsed := time.Unix(0, lastAt.Load()).Sub(start)
	level.Set(slog.LevelError + 4)
	if err := fwd.Close(); err != nil {
		return err
	}

	published, err := endOffsets(ctx, addrs, destTopic)
	if err != nil {
		return err
	}
	if published < want {
		return fmt.Errorf("the broker holds %d records on %s; want %d", published, destTopic, want)
	}
	res := Result{Events: forwarded.Load(), Published: published, Seconds: elapsed.Seconds(), EventsPerS: float64(want) / elapsed.Seconds(),
		BatchSize: *batch, PollMS: float64(*poll) / float64(time.Millisecond), Watermill: "watermill v1.5.1, watermill-sql v4.1.2, watermill-kafka v3.0.6"}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("watermill forwarder: %d events in %.2fs = %.0f events/s (batch %d, poll %s)\n", res.Events, res.Seconds, res.EventsPerS, *batch, *poll)
	return nil
}

// order mirrors the outbox bench's payload: about 200 bytes of JSON.
type order struct {
	OrderID    uuid.UUID `json:"order_id"`
	CustomerID string    `json:"customer_id"`
	TotalCents int64     `json:"total_cents"`
	Currency   string    `json:"currency"`
	Items      []item    `json:"items"`
}

type item struct {
	SKU        string `json:"sku"`
	Qty        int    `json:"qty"`
	PriceCents int64  `json:"price_cents"`
}

// preload publishes events through the forwarder's publisher, 1,000 per
// INSERT, outside the timed part.
func preload(pub message.Publisher, events, aggs int) error {
	aggIDs := make([]string, aggs)
	for i := range aggIDs {
		aggIDs[i] = uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "aggregate-%d", i)).String()
	}
	for start := 0; start < events; start += 1000 {
		var msgs []*message.Message
		for i := start; i < min(events, start+1000); i++ {
			payload, err := json.Marshal(order{OrderID: uuid.New(), CustomerID: fmt.Sprintf("customer-%d", i%aggs), TotalCents: int64(i*7919) % 100000,
				Currency: "EUR", Items: []item{{SKU: fmt.Sprintf("SKU-%d", i%97), Qty: 1 + i%5, PriceCents: 1999}}})
			if err != nil {
				return err
			}
			m := message.NewMessage(watermill.NewUUID(), payload)
			m.Metadata.Set("aggregate_id", aggIDs[i%aggs])
			m.Metadata.Set("event_type", "order.placed")
			msgs = append(msgs, m)
		}
		if err := pub.Publish(destTopic, msgs...); err != nil {
			return fmt.Errorf("preload: %w", err)
		}
	}
	return nil
}

// privateSchema creates a schema for this run and returns a pool whose
// search_path points at it (Watermill creates its tables unqualified).
func privateSchema(ctx context.Context, dbURL string) (*pgxpool.Pool, string, func(), error) {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	schema := "bench_watermill_" + hex.EncodeToString(rnd[:])
	admin, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, "", nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	if _, err := admin.Exec(ctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
		admin.Close()
		return nil, "", nil, fmt.Errorf("create schema (is Postgres running? set --database-url): %w", err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.Exec(dctx, `DROP SCHEMA "`+schema+`" CASCADE`); err != nil {
			fmt.Fprintf(os.Stderr, "watermill bench: drop schema %s: %v\n", schema, err)
		}
		admin.Close()
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	return pool, schema, func() { pool.Close(); drop() }, nil
}

func endOffsets(ctx context.Context, addrs []string, topic string) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	offs.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, offs.Error()
}

func splitBrokers(s string) []string {
	var out []string
	for b := range strings.SplitSeq(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
