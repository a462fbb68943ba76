package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"math"
	"os"
	"os/signal"
	"syscall"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
)

type OrderPlaced struct {
	OrderID    uuid.UUID `json:"order_id"`
	CustomerID uuid.UUID `json:"customer_id"`
	TotalCents int64     `json:"total_cents"`
}

// A loyalty service: order.placed events from Kafka award points, once per
// order however often Kafka delivers the event.
//
// It has no Output, so go test compiles it and does not run it: it runs
// until SIGTERM, against a broker at localhost:9092. `go run
// ./examples/orders` runs the same consumer end to end (embedded broker,
// relayer, orders) and its test checks what it prints.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	c, err := consumer.New(consumer.Config{
		Name:   "loyalty",
		Pool:   pool,
		Client: kafka.ClientConfig{Brokers: []string{"localhost:9092"}},
		Topics: []string{"order"},
		Handlers: map[string]consumer.Handler{
			"order.placed": consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev consumer.Event, o OrderPlaced) error {
				_, err := tx.Exec(ctx, `INSERT INTO loyalty_points (customer_id, points) VALUES ($1, $2)
ON CONFLICT (customer_id) DO UPDATE SET points = loyalty_points.points + EXCLUDED.points`, o.CustomerID, o.TotalCents/100)
				return err
			}),
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Until SIGTERM; then the transaction in flight finishes and the
	// offsets of what is done are committed.
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// The processing core without Kafka: events that arrive by webhook, say,
// deduplicated under the same consumer name.
func ExampleProcessor_Process() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	p, err := consumer.NewProcessor(consumer.ProcessorConfig{Name: "loyalty", Pool: pool})
	if err != nil {
		log.Fatal(err)
	}
	award := consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev consumer.Event, o OrderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO loyalty_points (customer_id, points) VALUES ($1, $2)
ON CONFLICT (customer_id) DO UPDATE SET points = loyalty_points.points + EXCLUDED.points`, o.CustomerID, o.TotalCents/100)
		return err
	})
	customer := uuid.New()
	body, _ := json.Marshal(OrderPlaced{OrderID: uuid.New(), CustomerID: customer, TotalCents: 1250})
	ev := consumer.Event{ID: 42, Source: "shop-eu", Type: "order.placed", Payload: body}
	for range 2 { // the webhook is called twice with the same event
		out, err := p.Process(ctx, ev, award)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out)
	}
	var points int64
	if err := pool.QueryRow(ctx, "SELECT points FROM loyalty_points WHERE customer_id = $1", customer).Scan(&points); err != nil {
		log.Fatal(err)
	}
	fmt.Println("points:", points)
	// Output:
	// processed
	// duplicate
	// points: 12
}

// exampleDatabase is where the examples run under go test: a database of
// the example's own on the tests' server (DATABASE_URL, default the local
// "test" database's server), with the outbox tables migrated in its public
// schema, as `outbox migrate up` would, and a loyalty_points table; drop
// drops it. Your code connects to its DATABASE_URL.
func exampleDatabase() (url string, drop func()) {
	ctx := context.Background()
	url, drop, err := pgtest.ScratchDatabase(ctx, "consumer_example")
	if err != nil {
		log.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		_, err = conn.Exec(ctx, "CREATE TABLE loyalty_points (customer_id UUID PRIMARY KEY, points BIGINT NOT NULL)")
		_ = conn.Close(ctx)
	}
	if err != nil {
		drop()
		log.Fatal(err)
	}
	return url, drop
}

// A handler that reads order.placed v2 sees v1 events upcast, and applies
// an event dual-emitted as v1 and v2 once, from its v2 row.
func ExampleUpcasters_Want() {
	ups := &consumer.Upcasters{}
	err := ups.Register("order.placed", 1, func(p json.RawMessage) (json.RawMessage, error) {
		var v1 struct {
			OrderID string  `json:"order_id"`
			Total   float64 `json:"total"`
		}
		if err := json.Unmarshal(p, &v1); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]any{"order_id": v1.OrderID, "total_cents": int64(math.Round(v1.Total * 100)), "currency": "EUR"})
	})
	if err != nil {
		log.Fatal(err)
	}
	handle := ups.Want("order.placed", 2)(func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		fmt.Printf("event %d as v%d: %s\n", ev.ID, ev.Version, ev.Payload)
		return nil
	})
	for _, ev := range []consumer.Event{
		{ID: 1, Type: "order.placed", Payload: []byte(`{"order_id":"a","total":12.5}`),
			Headers: map[string]string{"event_version": "1"}},
		// A dual emit: the v1 row is skipped, the v2 row applied.
		{ID: 2, Type: "order.placed", Payload: []byte(`{"order_id":"b","total":30}`),
			Headers: map[string]string{"event_version": "1", "event_versions": "1,2"}},
		{ID: 3, Type: "order.placed", Payload: []byte(`{"order_id":"b","total_cents":3000,"currency":"EUR"}`),
			Headers: map[string]string{"event_version": "2", "event_versions": "1,2"}},
		// Newer than the handler: a Permanent error, dead-lettered.
		{ID: 4, Type: "order.placed", Payload: []byte(`{}`), Headers: map[string]string{"event_version": "3"}},
	} {
		if err := handle(context.Background(), nil, ev); err != nil {
			fmt.Println("dead letter:", consumer.IsPermanent(err))
		}
	}
	// Output:
	// event 1 as v2: {"currency":"EUR","order_id":"a","total_cents":1250}
	// event 3 as v2: {"order_id":"b","total_cents":3000,"currency":"EUR"}
	// dead letter: true
}
