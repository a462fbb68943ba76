// Command orders is the worked example end to end:
//
//	go run ./examples/orders
//
// It places a few orders in the Postgres of DATABASE_URL (libpq defaults,
// PGHOST and so on, when unset), each with its order.placed event in the
// same transaction, and one that fails and takes its event with it; an
// embedded Kafka-compatible broker takes what the relayer publishes; the
// loyalty consumer awards points once per order. It prints what happened
// and exits 0. It works in a schema of its own and drops it at the end.
//
// The code it runs, PlaceOrder and the loyalty handler, is in package
// shop beside it.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/examples/orders/shop"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, os.Getenv("DATABASE_URL")); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

// customer is one of the example's customers, with a name to print.
type customer struct {
	name string
	id   uuid.UUID
}

// run is the whole example, writing what happens to out.
func run(ctx context.Context, out io.Writer, databaseURL string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// Warnings only: the relayer and the consumer would otherwise log
	// every start and stop between the lines this prints.
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
	broker, err := devkafka.Start(devkafka.Config{})
	if err != nil {
		return err
	}
	defer broker.Close()
	brokers := kafka.ClientConfig{Brokers: []string{broker.Addr()}}

	alice, bob := customer{"alice", uuid.New()}, customer{"bob", uuid.New()}
	events, err := placeOrders(ctx, out, pool, tables, alice, bob)
	if err != nil {
		return err
	}
	if err := relayAndConsume(ctx, out, pool, tables, brokers, log, events); err != nil {
		return err
	}
	return reportPoints(ctx, out, pool, alice, bob)
}

// migrateAll creates the outbox's tables and the shop's.
func migrateAll(ctx context.Context, pool *pgxpool.Pool, tables outbox.Tables) error {
	m, err := migrate.New(tables)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx, pool); err != nil {
		return err
	}
	return shop.Migrate(ctx, pool)
}

// placeOrders is the shop: each order and its event commit together. It
// places three orders, then the first one again, which rolls back and
// takes its event with it, and returns how many events the outbox holds.
func placeOrders(ctx context.Context, out io.Writer, pool *pgxpool.Pool, tables outbox.Tables, alice, bob customer) (events int, err error) {
	producer, err := outbox.NewProducer(outbox.Config{Tables: tables})
	if err != nil {
		return 0, err
	}
	placed := []struct {
		who   customer
		cents int64
	}{{alice, 1250}, {bob, 3000}, {alice, 799}}
	var first shop.Order
	for i, p := range placed {
		o := shop.Order{ID: uuid.New(), CustomerID: p.who.id, TotalCents: p.cents}
		id, err := shop.PlaceOrder(ctx, pool, producer, o)
		if err != nil {
			return 0, err
		}
		if i == 0 {
			first = o
		}
		fmt.Fprintf(out, "order %d placed for %s: %d.%02d, event %d in the outbox\n", i+1, p.who.name, p.cents/100, p.cents%100, id)
	}
	// The same order id again: the insert fails, the transaction rolls
	// back, and no event exists for it.
	if _, err := shop.PlaceOrder(ctx, pool, producer, shop.Order{ID: first.ID, CustomerID: bob.id, TotalCents: 5000}); !shop.IsDuplicate(err) {
		return 0, fmt.Errorf("placing order 1 again: want a duplicate order id, got %v", err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.OutboxIdent()).Scan(&events); err != nil {
		return 0, err
	}
	fmt.Fprintf(out, "order 1 placed again: rolled back (duplicate order id), no event; %d events in the outbox\n", events)
	return events, nil
}

// relayAndConsume runs the relayer, which publishes what committed, and
// the loyalty service, which consumes it, until the service has processed
// the outbox's events.
func relayAndConsume(ctx context.Context, out io.Writer, pool *pgxpool.Pool, tables outbox.Tables, brokers kafka.ClientConfig, log *slog.Logger, events int) error {
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
	loyalty, err := consumer.New(consumer.Config{Name: shop.LoyaltyConsumer, Pool: pool, Tables: tables, Client: brokers,
		Topics: []string{shop.Topic}, Handlers: shop.Handlers(), Logger: log})
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return r.Run(gctx) })
	g.Go(func() error { return loyalty.Run(gctx) })
	waitErr := waitUntil(gctx, func() bool { return loyalty.Stats().Processed >= int64(events) })
	stopRun()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if waitErr != nil {
		return fmt.Errorf("waiting for the loyalty service to process %d events: %w", events, waitErr)
	}
	fmt.Fprintf(out, "relayed %d events to topic %q; the loyalty service processed %d\n", r.Stats().Dispatched, shop.Topic, loyalty.Stats().Processed)
	return nil
}

// reportPoints prints alice's and bob's loyalty points and fails unless
// every customer's points match their orders.
func reportPoints(ctx context.Context, out io.Writer, pool *pgxpool.Pool, alice, bob customer) error {
	points, err := shop.CheckPoints(ctx, pool)
	if err != nil {
		return err
	}
	var a, b int64
	for _, c := range []struct {
		id uuid.UUID
		p  *int64
	}{{alice.id, &a}, {bob.id, &b}} {
		if err := pool.QueryRow(ctx, "SELECT coalesce((SELECT points FROM loyalty_points WHERE customer_id = $1), 0)", c.id).Scan(c.p); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "loyalty points: alice %d, bob %d (one point per whole %d cents of each order)\n", a, b, shop.CentsPerPoint)
	if !points.OK() {
		return fmt.Errorf("loyalty points do not match the orders: %s", points)
	}
	return nil
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
	schema := "orders_example_" + hex.EncodeToString(rnd[:])
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
