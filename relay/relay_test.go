package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
)

// Must-show 2: exactly the committed events reach Kafka; none from rolled
// back transactions, including one rolled back by a unique violation on a
// business table.
func TestRelayPublishesExactlyCommittedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.db.Pool.Exec(ctx, "CREATE TABLE orders (id UUID PRIMARY KEY, total_cents BIGINT NOT NULL)")
	require.NoError(t, err)

	placeOrder := func(orderID uuid.UUID, total int64) (int64, error) {
		var id int64
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total_cents) VALUES ($1, $2)", orderID, total); err != nil {
				return err
			}
			var err error
			id, err = b.producer.Emit(ctx, tx, outbox.Event{AggregateID: orderID, Type: "order.placed",
				Payload: map[string]any{"order_id": orderID, "total_cents": total}})
			return err
		})
		return id, err
	}

	committed := map[int64]bool{}
	dup := uuid.New()
	for i := range 50 {
		id, err := placeOrder(uuid.New(), int64(100+i))
		require.NoError(t, err)
		committed[id] = true
	}
	id, err := placeOrder(dup, 999)
	require.NoError(t, err)
	committed[id] = true

	// Rolled back by the application.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.producer.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"rolled": 1}})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	// Rolled back by a unique violation: the event is emitted first, then
	// the business insert fails.
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: dup, Type: "order.placed", Payload: map[string]int{"dup": 1}}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO orders (id, total_cents) VALUES ($1, 1)", dup)
		return err
	})
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want a unique violation, got %v", err)
	require.Equal(t, "23505", pgErr.Code)
	// And the seed's order: business insert first, then the failure.
	_, err = placeOrder(dup, 5)
	require.Error(t, err)

	r := b.relayer(t, nil)
	run(t, r)
	b.waitDrained(t, 20*time.Second)

	recs := b.consume(t, len(committed), 20*time.Second, "order")
	got := map[int64]bool{}
	for _, rec := range recs {
		require.True(t, committed[rec.EventID], "event %d was not committed", rec.EventID)
		got[rec.EventID] = true
		require.Equal(t, "order.placed", rec.Headers["event_type"])
		require.Equal(t, "application/json", rec.Headers["content-type"])
		require.NotContains(t, rec.Value, "rolled")
		require.NotContains(t, rec.Value, "dup")
	}
	require.Len(t, recs, len(committed), "no duplicates in a clean run")
	require.Equal(t, committed, got)
	require.EqualValues(t, len(committed), r.Stats().Dispatched)
}
