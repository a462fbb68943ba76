package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// Emit inside the transaction that makes the business write.
func ExampleEmit() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, "") // libpq defaults / PG* environment
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer conn.Close(ctx)

	orderID := uuid.New()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// ... insert the order with tx ...
		_, err := outbox.Emit(ctx, tx, outbox.Event{
			AggregateID: orderID,
			Type:        "order.placed",
			Payload:     map[string]any{"order_id": orderID, "total_cents": 1999},
		})
		return err
	})
	if err != nil {
		fmt.Println("order not placed:", err)
	}
}

// EmitBatch writes several events in one round trip, inside the same kind
// of transaction: they all exist iff it commits.
func ExampleEmitBatch() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, "") // libpq defaults / PG* environment
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer conn.Close(ctx)

	orderID := uuid.New()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// ... insert the order and its lines with tx ...
		ids, err := outbox.EmitBatch(ctx, tx, []outbox.Event{
			{AggregateID: orderID, Type: "order.placed", Payload: map[string]any{"order_id": orderID}},
			{AggregateID: orderID, Type: "order.paid", Payload: map[string]any{"order_id": orderID}},
		})
		_ = ids // in input order
		return err
	})
	if err != nil {
		fmt.Println("order not placed:", err)
	}
}

// EmitSQL is Emit for a database/sql transaction (here through pgx's
// stdlib driver, registered as "pgx"; lib/pq works the same way).
func ExampleEmitSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "")
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer db.Close()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	orderID := uuid.New()
	// ... insert the order with tx ...
	if _, err := outbox.EmitSQL(ctx, tx, outbox.Event{
		AggregateID: orderID,
		Type:        "order.placed",
		Payload:     map[string]any{"order_id": orderID, "total_cents": 1999},
	}); err != nil {
		fmt.Println("order not placed:", err)
		return
	}
	if err := tx.Commit(); err != nil {
		fmt.Println("order not placed:", err)
	}
}

// QueueEmit sends the event with the business write in one round trip.
func ExampleQueueEmit() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, "") // libpq defaults / PG* environment
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer conn.Close(ctx)

	orderID := uuid.New()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		batch.Queue("INSERT INTO orders (id, total_cents) VALUES ($1, $2)", orderID, 1999)
		ev, err := outbox.QueueEmit(batch, outbox.Event{
			AggregateID: orderID,
			Type:        "order.placed",
			Payload:     map[string]any{"order_id": orderID, "total_cents": 1999},
		})
		if err != nil {
			return err // invalid event: nothing was queued
		}
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return err
		}
		_ = ev.ID // set once the batch's results are read
		return nil
	})
	if err != nil {
		fmt.Println("order not placed:", err)
	}
}

// Validation errors are typed and say what to fix; nothing was written.
func ExampleProducer_Emit_validation() {
	p, _ := outbox.NewProducer(outbox.Config{})
	_, err := p.Emit(context.Background(), nil, outbox.Event{Type: "order.placed", Payload: 1})
	fmt.Println(errors.Is(err, outbox.ErrNilAggregate))
	// Output: true
}

// The size limit is checked on the record the broker will see: the payload
// as Postgres prints its JSONB, plus the key and the headers. These 601
// bytes of "[0,0,...]" are published as 900 ("[0, 0, ...]"): a record of
// 1317 bytes, over this producer's 1200, though 1018 as given would fit.
func ExampleProducer_Emit_recordSize() {
	p, _ := outbox.NewProducer(outbox.Config{MaxRecordBytes: 1200})
	zeros := "[0" + strings.Repeat(",0", 299) + "]"
	fmt.Println(len(zeros), outbox.MaxRecordSize("order.placed", len(zeros), nil), outbox.MaxRecordSize("order.placed", 900, nil))
	_, err := p.Emit(context.Background(), nil, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: json.RawMessage(zeros)})
	fmt.Println(errors.Is(err, outbox.ErrPayloadTooLarge))
	// Output:
	// 601 1018 1317
	// true
}

// The topic is the event type up to its first '.', after an optional prefix.
func ExampleTopic() {
	topic, _ := outbox.Topic("prod.", "order.placed")
	fmt.Println(topic)
	_, err := outbox.Topic("", "order placed")
	fmt.Println(errors.Is(err, outbox.ErrInvalidTopic))
	// Output:
	// prod.order
	// true
}
