package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// guardVariants are the insert-time checks BenchmarkInsertGuard compares,
// each on its own schema: none (migration 5), the guard trigger as
// migration 6 made it (rules only) and as migration 7 makes it (the id
// check in front), the same rules as CHECK constraints (which migration 6
// does not use: a CHECK also refuses the claim's UPDATE of an old bad
// row), and the guard plus a payload size check, which serialises the
// payload as the relayer will publish it.
var guardVariants = []struct {
	name   string
	setup  []string // after migrating to downTo (0: the latest version)
	downTo int
}{
	{name: "none", downTo: 5},
	{name: "trigger6", downTo: 6},
	{name: "trigger"},
	{name: "check", downTo: 5, setup: []string{
		`ALTER TABLE {{outbox}} ADD CONSTRAINT events_outbox_type_topic CHECK (type ~ '^[a-zA-Z0-9_-]+(\.|$)' AND octet_length(split_part(type, '.', 1)) <= 249) NOT VALID`,
		`ALTER TABLE {{outbox}} ADD CONSTRAINT events_outbox_headers_shape CHECK (headers IS NULL OR jsonb_typeof(headers) = 'null'
  OR (jsonb_typeof(headers) = 'object' AND NOT headers ?| '{event_id,event_type,content-type,event_source}'::text[] AND NOT headers ? ''
      AND NOT jsonb_path_exists(headers, 'strict $.* ? (@.type() != "string")', '{}', true))) NOT VALID`,
	}},
	{name: "trigger+size", setup: []string{
		`ALTER TABLE {{outbox}} ADD CONSTRAINT events_outbox_payload_size CHECK (octet_length(payload::text) <= 1048588) NOT VALID`,
	}},
}

func guardDB(b *testing.B, downTo int, setup []string) *pgtest.DB {
	b.Helper()
	ctx := context.Background()
	db := pgtest.New(b, pgtest.Options{MaxConns: 2})
	if downTo > 0 {
		m, err := migrate.New(db.Tables)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.Down(ctx, db.Pool, downTo); err != nil {
			b.Fatal(err)
		}
	}
	for _, s := range setup {
		if _, err := db.Pool.Exec(ctx, strings.ReplaceAll(s, "{{outbox}}", db.Tables.OutboxIdent())); err != nil {
			b.Fatal(err)
		}
	}
	return db
}

const (
	benchHeaders = `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`
	benchPayload = `{"order_id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8", "customer_id": "customer-42", "total_cents": 1999, "currency": "EUR", "items": [{"sku": "SKU-1", "qty": 1}]}`
)

// BenchmarkInsertGuard: what the guard costs a plain INSERT and Emit.
//   - insert: one plain INSERT with headers, autocommit, on one connection
//     with synchronous_commit off (so the fsync does not drown it);
//   - insert-1000: 1,000 rows in one INSERT ... SELECT, rolled back (the
//     per-row cost of the check, nothing else);
//   - insert-100kB: one row with a 100 kB payload, synchronous_commit off;
//   - emit: Go's Emit in a transaction rolled back (as BenchmarkEmit's
//     "rollback").
//
// Run with -count to alternate the variants on a noisy machine.
func BenchmarkInsertGuard(b *testing.B) {
	big := `{"blob": "` + strings.Repeat("p", 100_000) + `"}`
	for _, v := range guardVariants {
		b.Run(v.name, func(b *testing.B) {
			b.Run("insert", func(b *testing.B) { benchPlainInsert(b, guardDB(b, v.downTo, v.setup), benchPayload) })
			b.Run("insert-100kB", func(b *testing.B) { benchPlainInsert(b, guardDB(b, v.downTo, v.setup), big) })
			b.Run("insert-1000", func(b *testing.B) {
				db := guardDB(b, v.downTo, v.setup)
				ctx := context.Background()
				for b.Loop() {
					tx, err := db.Pool.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := tx.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, headers)
SELECT gen_random_uuid(), 'order.placed', $1::jsonb, $2::jsonb FROM generate_series(1, 1000)`, benchPayload, benchHeaders); err != nil {
						b.Fatal(err)
					}
					if err := tx.Rollback(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("emit", func(b *testing.B) {
				db := guardDB(b, v.downTo, v.setup)
				p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				ev := outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: []byte(benchPayload),
					Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
				for b.Loop() {
					tx, err := db.Pool.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := p.Emit(ctx, tx, ev); err != nil {
						b.Fatal(err)
					}
					if err := tx.Rollback(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

func benchPlainInsert(b *testing.B, db *pgtest.DB, payload string) {
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		b.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, "RESET synchronous_commit") }()
	stmt := "INSERT INTO " + db.Tables.OutboxIdent() + " (aggregate_id, type, payload, headers) VALUES ($1, 'order.placed', $2::jsonb, $3::jsonb)"
	agg := uuid.New()
	for b.Loop() {
		if _, err := conn.Exec(ctx, stmt, agg, payload, benchHeaders); err != nil {
			b.Fatal(err)
		}
	}
}
