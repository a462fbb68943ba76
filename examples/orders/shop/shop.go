// Package shop is the code of the worked example (examples/orders): a
// shop places orders and emits order.placed in the same transaction, and
// its loyalty service awards points once per order, however often the
// event is delivered. `go run ./examples/orders` runs it end to end.
//
//	id, err := shop.PlaceOrder(ctx, pool, producer, shop.Order{ID: uuid.New(), CustomerID: c, TotalCents: 1250})
//
//	c, err := consumer.New(consumer.Config{Name: shop.LoyaltyConsumer, Pool: pool,
//		Topics: []string{shop.Topic}, Handlers: shop.Handlers(), Client: ...})
//
// Its tables (orders, loyalty_points) are unqualified: they land in the
// first schema of the connection's search_path.
package shop

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
)

const (
	// EventOrderPlaced is the type of the event PlaceOrder emits.
	EventOrderPlaced = "order.placed"
	// Topic is where order.placed events are published.
	Topic = "order"
	// LoyaltyConsumer is the consumer name of the loyalty service.
	LoyaltyConsumer = "loyalty"
	// CentsPerPoint: an order earns total_cents / CentsPerPoint points,
	// rounded down.
	CentsPerPoint = 100
)

// Order is a placed order.
type Order struct {
	ID         uuid.UUID
	CustomerID uuid.UUID
	TotalCents int64
}

// OrderPlaced is the payload of order.placed.
type OrderPlaced struct {
	OrderID    uuid.UUID `json:"order_id"`
	CustomerID uuid.UUID `json:"customer_id"`
	TotalCents int64     `json:"total_cents"`
}

// Execer is what Migrate needs; *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Beginner is what PlaceOrder needs; *pgxpool.Pool and *pgx.Conn have it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Querier is what the point reports need; *pgxpool.Pool and pgx.Tx have it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const migrateSQL = `
CREATE TABLE IF NOT EXISTS orders (
  id          UUID        PRIMARY KEY,
  customer_id UUID        NOT NULL,
  total_cents BIGINT      NOT NULL CHECK (total_cents >= 0),
  created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS loyalty_points (
  customer_id UUID   PRIMARY KEY,
  points      BIGINT NOT NULL
);`

// Migrate creates the example's tables if they do not exist.
func Migrate(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, migrateSQL); err != nil {
		return fmt.Errorf("shop: create tables: %w", err)
	}
	return nil
}

// ErrInvalidOrder is returned, wrapped, for an order PlaceOrder refuses
// before touching the database.
var ErrInvalidOrder = errors.New("shop: invalid order")

// PlaceOrder is the seed's place_order: it inserts the order and emits
// order.placed (aggregate = order id) in one transaction, and returns the
// event's id. Both happen or neither: an order id that exists already fails
// with a unique violation (see IsDuplicate), and no event is emitted.
func PlaceOrder(ctx context.Context, db Beginner, producer *outbox.Producer, o Order) (int64, error) {
	switch {
	case producer == nil:
		return 0, errors.New("shop: producer is nil; pass an *outbox.Producer for the outbox table")
	case o.ID == uuid.Nil:
		return 0, fmt.Errorf("%w: the order id is the nil UUID", ErrInvalidOrder)
	case o.CustomerID == uuid.Nil:
		return 0, fmt.Errorf("%w: order %s has the nil UUID as customer", ErrInvalidOrder, o.ID)
	case o.TotalCents < 0:
		return 0, fmt.Errorf("%w: order %s totals %d cents; totals are not negative", ErrInvalidOrder, o.ID, o.TotalCents)
	}
	var id int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer_id, total_cents) VALUES ($1, $2, $3)`,
			o.ID, o.CustomerID, o.TotalCents); err != nil {
			return err
		}
		var err error
		id, err = producer.Emit(ctx, tx, outbox.Event{
			AggregateID: o.ID,
			Type:        EventOrderPlaced,
			Payload:     OrderPlaced{OrderID: o.ID, CustomerID: o.CustomerID, TotalCents: o.TotalCents},
		})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("shop: place order %s: %w", o.ID, err)
	}
	return id, nil
}

// IsDuplicate reports whether err is PlaceOrder's failure on an order id
// that exists already.
func IsDuplicate(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.TableName == "orders"
}

// HandleOrderPlaced is the seed's handle_order_placed: it awards
// total_cents / 100 points to the customer, in the consumer's transaction,
// so the award and the event's dedupe row commit together.
func HandleOrderPlaced(ctx context.Context, tx pgx.Tx, _ consumer.Event, o OrderPlaced) error {
	if o.CustomerID == uuid.Nil {
		return consumer.Permanent(fmt.Errorf("order %s has no customer_id", o.OrderID))
	}
	_, err := tx.Exec(ctx, `INSERT INTO loyalty_points (customer_id, points) VALUES ($1, $2)
ON CONFLICT (customer_id) DO UPDATE SET points = loyalty_points.points + EXCLUDED.points`,
		o.CustomerID, o.TotalCents/CentsPerPoint)
	if err != nil {
		return fmt.Errorf("award points for order %s: %w", o.OrderID, err)
	}
	return nil
}

// Handlers are the loyalty service's handlers, by event type.
func Handlers() map[string]consumer.Handler {
	return map[string]consumer.Handler{EventOrderPlaced: consumer.Typed(HandleOrderPlaced)}
}

// Points compares the points awarded with those the committed orders
// earn.
type Points struct {
	// Orders is the number of committed orders.
	Orders int64
	// Expected is the sum over committed orders of total_cents / 100.
	Expected int64
	// Awarded is the sum of loyalty_points.
	Awarded int64
	// Mismatched counts customers whose points differ from what their
	// orders earn.
	Mismatched int64
}

// OK reports whether every customer has exactly the points their orders
// earn.
func (p Points) OK() bool { return p.Expected == p.Awarded && p.Mismatched == 0 }

func (p Points) String() string {
	return fmt.Sprintf("%d orders, %d points expected, %d awarded, %d customers mismatched", p.Orders, p.Expected, p.Awarded, p.Mismatched)
}

// Expected points are computed per order (integer division per row), as
// the handler awards them.
const pointsSQL = `WITH earned AS (
  SELECT customer_id, count(*) AS orders, sum(total_cents / $1::int8) AS points FROM orders GROUP BY customer_id
)
SELECT
  coalesce((SELECT sum(orders) FROM earned), 0)::int8,
  coalesce((SELECT sum(points) FROM earned), 0)::int8,
  coalesce((SELECT sum(points) FROM loyalty_points), 0)::int8,
  (SELECT count(*) FROM earned e FULL JOIN loyalty_points l USING (customer_id)
    WHERE coalesce(e.points, 0) <> coalesce(l.points, 0))`

// CheckPoints computes the points the committed orders earn and compares
// them with the points awarded, per customer.
func CheckPoints(ctx context.Context, db Querier) (Points, error) {
	var p Points
	if err := db.QueryRow(ctx, pointsSQL, CentsPerPoint).Scan(&p.Orders, &p.Expected, &p.Awarded, &p.Mismatched); err != nil {
		return p, fmt.Errorf("shop: check points: %w", err)
	}
	return p, nil
}
