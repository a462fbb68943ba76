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
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// exampleDatabase is where the examples below run under go test: a
// database of the example's own on the tests' server (DATABASE_URL,
// default the local "test" database's server), with the outbox tables
// migrated in its public schema, as `outbox migrate up` would, and an
// orders table; drop drops it. Your code connects to its DATABASE_URL.
func exampleDatabase() (url string, drop func()) {
	ctx := context.Background()
	url, drop, err := pgtest.ScratchDatabase(ctx, "outbox_example")
	if err != nil {
		panic(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		_, err = conn.Exec(ctx, "CREATE TABLE orders (id UUID PRIMARY KEY, total_cents BIGINT NOT NULL)")
		_ = conn.Close(ctx)
	}
	if err != nil {
		drop()
		panic(err)
	}
	return url, drop
}

// Emit inside the transaction that makes the business write.
func ExampleEmit() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer conn.Close(ctx)

	orderID := uuid.New()
	var eventID int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total_cents) VALUES ($1, $2)", orderID, 1999); err != nil {
			return err
		}
		eventID, err = outbox.Emit(ctx, tx, outbox.Event{
			AggregateID: orderID,
			Type:        "order.placed",
			Payload:     map[string]any{"order_id": orderID, "total_cents": 1999},
		})
		return err
	})
	if err != nil {
		fmt.Println("order not placed:", err)
		return
	}
	fmt.Println("order placed; event", eventID, "is in the outbox")
	// Output: order placed; event 1 is in the outbox
}

// EmitBatch writes several events in one round trip, inside the same kind
// of transaction: they all exist iff it commits.
func ExampleEmitBatch() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer conn.Close(ctx)

	orderID := uuid.New()
	var ids []int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// ... insert the order and its lines with tx ...
		var err error
		ids, err = outbox.EmitBatch(ctx, tx, []outbox.Event{
			{AggregateID: orderID, Type: "order.placed", Payload: map[string]any{"order_id": orderID}},
			{AggregateID: orderID, Type: "order.paid", Payload: map[string]any{"order_id": orderID}},
		})
		return err
	})
	if err != nil {
		fmt.Println("order not placed:", err)
		return
	}
	fmt.Println("events", ids) // in input order
	// Output: events [1 2]
}

// EmitSQL is Emit for a database/sql transaction (here through pgx's
// stdlib driver, registered as "pgx"; lib/pq works the same way).
func ExampleEmitSQL() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()
	db, err := sql.Open("pgx", databaseURL)
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
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total_cents) VALUES ($1, $2)", orderID, 1999); err != nil {
		fmt.Println("order not placed:", err)
		return
	}
	eventID, err := outbox.EmitSQL(ctx, tx, outbox.Event{
		AggregateID: orderID,
		Type:        "order.placed",
		Payload:     map[string]any{"order_id": orderID, "total_cents": 1999},
	})
	if err != nil {
		fmt.Println("order not placed:", err)
		return
	}
	if err := tx.Commit(); err != nil {
		fmt.Println("order not placed:", err)
		return
	}
	fmt.Println("order placed; event", eventID, "is in the outbox")
	// Output: order placed; event 1 is in the outbox
}

// QueueEmit sends the event with the business write in one round trip.
func ExampleQueueEmit() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer conn.Close(ctx)

	orderID := uuid.New()
	var eventID int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		batch.Queue("INSERT INTO orders (id, total_cents) VALUES ($1, $2)", orderID, 1999)
		ev, err := outbox.QueueEmit(ctx, batch, outbox.Event{
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
		eventID = ev.ID // set once the batch's results are read
		return nil
	})
	if err != nil {
		fmt.Println("order not placed:", err)
		return
	}
	fmt.Println("order placed; event", eventID, "is in the outbox")
	// Output: order placed; event 1 is in the outbox
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
	fmt.Println(len(zeros), outbox.KafkaRouting{}.Size("order.placed", len(zeros), nil), outbox.KafkaRouting{}.Size("order.placed", 900, nil))
	_, err := p.Emit(context.Background(), nil, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: json.RawMessage(zeros)})
	fmt.Println(errors.Is(err, outbox.ErrPayloadTooLarge))
	// Output:
	// 601 1018 1317
	// true
}

// With the Kafka routing, the topic is the event type up to its first '.',
// after an optional prefix.
func ExampleKafkaRouting_Destination() {
	topic, _ := outbox.KafkaRouting{TopicPrefix: "prod."}.Destination("order.placed")
	fmt.Println(topic)
	_, err := outbox.KafkaRouting{}.Destination("order placed")
	fmt.Println(errors.Is(err, outbox.ErrInvalidTopic))
	// Output:
	// prod.order
	// true
}

// EmitVersions writes one logical event in two versions of its contract
// while consumers migrate from v1 to v2: a row per version, each carrying
// the event_versions header that lets a consumer apply one of them.
func ExampleEmitVersions() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer conn.Close(ctx)

	orderID := uuid.New()
	var ids []int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// ... insert the order with tx ...
		var err error
		ids, err = outbox.EmitVersions(ctx, tx, outbox.Event{AggregateID: orderID, Type: "order.placed"},
			outbox.VersionedPayload{Version: 1, Payload: map[string]any{"order_id": orderID, "total": 19.99}},
			outbox.VersionedPayload{Version: 2, Payload: map[string]any{"order_id": orderID, "total_cents": 1999, "currency": "EUR"}},
		)
		return err
	})
	if err != nil {
		fmt.Println("order not placed:", err)
		return
	}
	fmt.Println("ids", ids)
	rows, err := conn.Query(ctx, "SELECT id, headers->>'event_version', headers->>'event_versions' FROM events_outbox ORDER BY id")
	if err != nil {
		fmt.Println("read back:", err)
		return
	}
	var (
		id            int64
		version, list string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &version, &list}, func() error {
		fmt.Printf("event %d: version %s of %s\n", id, version, list)
		return nil
	})
	if err != nil {
		fmt.Println("read back:", err)
	}
	// Output:
	// ids [1 2]
	// event 1: version 1 of 1,2
	// event 2: version 2 of 1,2
}

// A payload of exact bytes (here a Protobuf message) with its content
// type, into an outbox with binary payloads on (`outbox migrate up
// --binary-payloads`). The relayer publishes the bytes as they are, with
// content-type application/x-protobuf.
func ExampleBytes() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		fmt.Println("no database:", err)
		return
	}
	defer conn.Close(ctx)
	m, _ := migrate.New(outbox.Tables{})
	if _, err := m.EnableBinaryPayloads(ctx, conn); err != nil { // once, as the table's owner
		fmt.Println("binary payloads not on:", err)
		return
	}

	producer, _ := outbox.NewProducer(outbox.Config{BinaryPayloads: true})
	order := []byte{0x08, 0xcf, 0x0f, 0x12, 0x03, 'E', 'U', 'R'} // proto.Marshal(&pb.Order{TotalCents: 1999, Currency: "EUR"})
	var eventID int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		eventID, err = producer.Emit(ctx, tx, outbox.Event{
			AggregateID: uuid.New(),
			Type:        "order.placed",
			Payload:     outbox.Bytes{ContentType: "application/x-protobuf", Data: order},
		})
		return err
	})
	if err != nil {
		fmt.Println("not emitted:", err)
		return
	}
	var stored []byte
	var contentType string
	_ = conn.QueryRow(ctx, "SELECT payload_bytes, content_type FROM events_outbox WHERE id = $1", eventID).Scan(&stored, &contentType)
	fmt.Printf("event %d: %x as %s\n", eventID, stored, contentType)
	// Output: event 1: 08cf0f1203455552 as application/x-protobuf
}
