// Command contracts is the worked example of evolving an event's contract:
//
//	go run ./examples/contracts
//
// order.placed changes shape: v1 carried {"order_id", "total": 12.5}, v2
// carries {"order_id", "total_cents": 1250, "currency": "EUR"}, a breaking
// change and so a new version (contracts/order.placed/). An order placed
// before the migration was emitted as v1 only; during the migration the
// shop emits each order as v1 and v2 at once (outbox.EmitVersions). Two
// billing consumers read the topic: the old one reads v1, the new one v2,
// with an upcaster from v1 for the events written before the migration.
// Each applies every order once. It prints what happened and exits 0.
//
// It runs in the Postgres of DATABASE_URL (libpq defaults when unset), in a
// schema of its own that it drops at the end, with an embedded
// Kafka-compatible broker.
package main

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/contracts"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// The contracts directory, as a service would keep it in its repository.
//
//go:embed contracts
var contractsDir embed.FS

const (
	eventType = "order.placed"
	topic     = "order"
)

// OrderPlacedV1 is order.placed version 1.
type OrderPlacedV1 struct {
	OrderID uuid.UUID `json:"order_id"`
	Total   float64   `json:"total"`
}

// OrderPlacedV2 is order.placed version 2.
type OrderPlacedV2 struct {
	OrderID    uuid.UUID `json:"order_id"`
	TotalCents int64     `json:"total_cents"`
	Currency   string    `json:"currency"`
}

// UpcastOrderPlacedV1 turns a v1 payload into v2, for consumers that read
// v2 and meet events written before the migration. The shop sold in euros
// only while it wrote v1, so the currency is EUR.
func UpcastOrderPlacedV1(payload json.RawMessage) (json.RawMessage, error) {
	var v1 OrderPlacedV1
	if err := json.Unmarshal(payload, &v1); err != nil {
		return nil, fmt.Errorf("decode v1: %w", err)
	}
	return json.Marshal(OrderPlacedV2{OrderID: v1.OrderID, TotalCents: int64(math.Round(v1.Total * 100)), Currency: "EUR"})
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, os.Getenv("DATABASE_URL")); err != nil {
		fmt.Fprintln(os.Stderr, "contracts:", err)
		os.Exit(1)
	}
}

// run is the whole example, writing what happens to out.
func run(ctx context.Context, out io.Writer, databaseURL string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pool, cleanup, err := openSchema(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer cleanup()
	tables := outbox.Tables{Schema: pool.Config().ConnConfig.RuntimeParams["search_path"]}.WithDefaults()
	if err := migrateAll(ctx, pool, tables); err != nil {
		return err
	}
	sub, err := fs.Sub(contractsDir, "contracts")
	if err != nil {
		return err
	}
	set, err := contracts.LoadFS(sub)
	if err != nil {
		return err
	}
	producer, err := outbox.NewProducer(outbox.Config{Tables: tables, Contracts: set})
	if err != nil {
		return err
	}
	names := map[uuid.UUID]string{}
	if err := emit(ctx, out, pool, producer, names); err != nil {
		return err
	}
	broker, err := devkafka.Start(devkafka.Config{})
	if err != nil {
		return err
	}
	defer broker.Close()
	if err := relayAndConsume(ctx, out, pool, tables, kafka.ClientConfig{Brokers: []string{broker.Addr()}}, log); err != nil {
		return err
	}
	return report(ctx, out, pool, names)
}

// emit is the shop: order A before the migration (v1 only), order B
// during it (v1 and v2), and an order whose v2 payload breaks its
// contract, which writes nothing.
func emit(ctx context.Context, out io.Writer, pool *pgxpool.Pool, producer *outbox.Producer, names map[uuid.UUID]string) error {
	a, b := uuid.New(), uuid.New()
	names[a], names[b] = "A", "B"
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err := producer.Emit(ctx, tx, outbox.Event{AggregateID: a, Type: eventType, Version: 1,
			Payload: OrderPlacedV1{OrderID: a, Total: 12.5}})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "before the migration: order A emitted as v1 (event %d)\n", id)

		ids, err := producer.EmitVersions(ctx, tx, outbox.Event{AggregateID: b, Type: eventType},
			outbox.VersionedPayload{Version: 1, Payload: OrderPlacedV1{OrderID: b, Total: 30}},
			outbox.VersionedPayload{Version: 2, Payload: OrderPlacedV2{OrderID: b, TotalCents: 3000, Currency: "EUR"}},
		)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "during the migration: order B emitted as v1 and v2 (events %d and %d, %s \"1,2\")\n", ids[0], ids[1], outbox.HeaderEventVersions)

		c := uuid.New()
		_, err = producer.EmitVersions(ctx, tx, outbox.Event{AggregateID: c, Type: eventType},
			outbox.VersionedPayload{Version: 1, Payload: OrderPlacedV1{OrderID: c, Total: 9.99}},
			outbox.VersionedPayload{Version: 2, Payload: map[string]any{"order_id": c, "total_cents": 9.99, "currency": "EUR"}},
		)
		var v *contracts.Violation
		if !errors.As(err, &v) {
			return fmt.Errorf("emitting a v2 payload with a decimal total_cents: want a contract violation, got %v", err)
		}
		fmt.Fprintf(out, "order C refused: v%d breaks its contract at %s (%s), so neither version was written\n", v.Version, v.Pointer, v.Rule)
		return nil
	})
}

// relayAndConsume publishes the outbox's rows and runs the old and the
// new billing consumer until each has settled every row.
func relayAndConsume(ctx context.Context, out io.Writer, pool *pgxpool.Pool, tables outbox.Tables, brokers kafka.ClientConfig, log *slog.Logger) error {
	client, err := kafkapub.NewPublisherClient(brokers)
	if err != nil {
		return err
	}
	defer client.Close()
	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: kafkapub.NewPublisher(client, kafkapub.PublisherConfig{}), Tables: tables, Logger: log},
		PollInterval: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	ups := &consumer.Upcasters{}
	if err := ups.Register(eventType, 1, UpcastOrderPlacedV1); err != nil {
		return err
	}
	oldBilling, err := consumer.New(consumer.Config{Name: "billing-v1", Pool: pool, Tables: tables, Client: brokers, Topics: []string{topic}, Logger: log,
		Handlers: map[string]consumer.Handler{eventType: ups.Want(eventType, 1)(consumer.Typed(billV1))}})
	if err != nil {
		return err
	}
	newBilling, err := consumer.New(consumer.Config{Name: "billing-v2", Pool: pool, Tables: tables, Client: brokers, Topics: []string{topic}, Logger: log,
		Handlers: map[string]consumer.Handler{eventType: ups.Want(eventType, 2)(consumer.Typed(billV2))}})
	if err != nil {
		return err
	}
	const rows = 3
	runCtx, stopRun := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return r.Run(gctx) })
	g.Go(func() error { return oldBilling.Run(gctx) })
	g.Go(func() error { return newBilling.Run(gctx) })
	waitErr := waitUntil(gctx, func() bool {
		return oldBilling.Stats().Processed >= rows && newBilling.Stats().Processed >= rows
	})
	stopRun()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if waitErr != nil {
		return fmt.Errorf("waiting for the consumers to settle %d rows: %w", rows, waitErr)
	}
	fmt.Fprintf(out, "relayed %d rows to topic %q; each consumer settled all %d\n", r.Stats().Dispatched, topic, rows)
	return nil
}

// billV1 is the old billing service: it reads v1.
func billV1(ctx context.Context, tx pgx.Tx, ev consumer.Event, o OrderPlacedV1) error {
	_, err := tx.Exec(ctx, `INSERT INTO billed_v1 (order_id, event_id, total) VALUES ($1, $2, $3)`, o.OrderID, ev.ID, o.Total)
	return err
}

// billV2 is the new billing service: it reads v2, upcast from v1 where
// that is what was written.
func billV2(ctx context.Context, tx pgx.Tx, ev consumer.Event, o OrderPlacedV2) error {
	_, err := tx.Exec(ctx, `INSERT INTO billed_v2 (order_id, event_id, total_cents, currency, upcast) VALUES ($1, $2, $3, $4, $5)`,
		o.OrderID, ev.ID, o.TotalCents, o.Currency, ev.OriginalPayload != nil)
	return err
}

// report prints what each consumer applied: every order once. The
// primary keys would have refused an order billed twice.
func report(ctx context.Context, out io.Writer, pool *pgxpool.Pool, names map[uuid.UUID]string) error {
	rows, err := pool.Query(ctx, `SELECT order_id, event_id, total FROM billed_v1 ORDER BY event_id`)
	if err != nil {
		return err
	}
	var (
		order uuid.UUID
		event int64
		total float64
	)
	_, err = pgx.ForEachRow(rows, []any{&order, &event, &total}, func() error {
		fmt.Fprintf(out, "billing-v1: order %s, total %.2f (from event %d, v1)\n", names[order], total, event)
		return nil
	})
	if err != nil {
		return err
	}
	rows, err = pool.Query(ctx, `SELECT order_id, event_id, total_cents, currency, upcast FROM billed_v2 ORDER BY event_id`)
	if err != nil {
		return err
	}
	var (
		cents    int64
		currency string
		upcast   bool
	)
	_, err = pgx.ForEachRow(rows, []any{&order, &event, &cents, &currency, &upcast}, func() error {
		from := "v2"
		if upcast {
			from = "v1, upcast"
		}
		fmt.Fprintf(out, "billing-v2: order %s, %d cents %s (from event %d, %s)\n", names[order], cents, currency, event, from)
		return nil
	})
	return err
}

const billingSQL = `
CREATE TABLE billed_v1 (order_id UUID PRIMARY KEY, event_id BIGINT NOT NULL, total NUMERIC NOT NULL);
CREATE TABLE billed_v2 (order_id UUID PRIMARY KEY, event_id BIGINT NOT NULL, total_cents BIGINT NOT NULL, currency TEXT NOT NULL, upcast BOOL NOT NULL);`

// migrateAll creates the outbox's tables and the billing services'.
func migrateAll(ctx context.Context, pool *pgxpool.Pool, tables outbox.Tables) error {
	m, err := migrate.New(tables)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx, pool); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, billingSQL)
	return err
}

// openSchema connects to databaseURL in a schema of the example's own,
// and returns a cleanup that closes the pool and drops the schema.
func openSchema(ctx context.Context, databaseURL string) (*pgxpool.Pool, func(), error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	admin, err := pgxpool.NewWithConfig(ctx, cfg.Copy())
	if err != nil {
		return nil, nil, err
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	schema := "contracts_example_" + hex.EncodeToString(rnd[:])
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		admin.Close()
		c := cfg.ConnConfig
		return nil, nil, fmt.Errorf("create a schema in Postgres at %s:%d/%s as %s: %w (set DATABASE_URL)", c.Host, c.Port, c.Database, c.User, err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	cleanup := func() {
		if pool != nil {
			pool.Close()
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		admin.Close()
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return pool, cleanup, nil
}

// waitUntil polls cond until it holds or ctx ends.
func waitUntil(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
