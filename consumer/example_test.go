package consumer_test

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/kafka"
)

type OrderPlaced struct {
	OrderID    uuid.UUID `json:"order_id"`
	CustomerID uuid.UUID `json:"customer_id"`
	TotalCents int64     `json:"total_cents"`
}

// A loyalty service: order.placed events from Kafka award points, once per
// order however often Kafka delivers the event.
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
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	p, err := consumer.NewProcessor(consumer.ProcessorConfig{Name: "loyalty", Pool: pool})
	if err != nil {
		log.Fatal(err)
	}
	body, _ := json.Marshal(OrderPlaced{OrderID: uuid.New(), CustomerID: uuid.New(), TotalCents: 1250})
	ev := consumer.Event{ID: 42, Source: "shop-eu", Type: "order.placed", Payload: body}
	out, err := p.Process(ctx, ev, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		_, err := tx.Exec(ctx, "UPDATE loyalty_points SET points = points + 12 WHERE customer_id = $1", uuid.Nil)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Println(out) // "processed" the first time, "duplicate" after
}
