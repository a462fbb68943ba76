package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// benchPayload is a ~200-byte order, marshalled by Emit on every call as
// an application's struct would be.
type benchPayload struct {
	OrderID    uuid.UUID `json:"order_id"`
	CustomerID string    `json:"customer_id"`
	TotalCents int64     `json:"total_cents"`
	Currency   string    `json:"currency"`
	Items      []struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	} `json:"items"`
}

func benchProducer(b *testing.B, cfg outbox.Config) (*pgtest.DB, *outbox.Producer) {
	b.Helper()
	db := pgtest.New(b, pgtest.Options{MaxConns: 2})
	cfg.Tables = db.Tables
	p, err := outbox.NewProducer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return db, p
}

func benchEvents(n int) []outbox.Event {
	evs := make([]outbox.Event, n)
	agg := uuid.New()
	for i := range evs {
		p := benchPayload{OrderID: agg, CustomerID: "customer-42", TotalCents: 1999, Currency: "EUR"}
		p.Items = append(p.Items, struct {
			SKU string `json:"sku"`
			Qty int    `json:"qty"`
		}{"SKU-1", 1 + i%3})
		evs[i] = outbox.Event{AggregateID: agg, Type: "order.placed", Payload: p, Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	}
	return evs
}

// BenchmarkEmit is one transaction per op: BEGIN, Emit, then COMMIT (the
// fsync dominates) or ROLLBACK (Emit's own cost: validation, marshalling,
// one round trip, the insert and its locks).
func BenchmarkEmit(b *testing.B) {
	for _, bc := range []struct {
		name   string
		cfg    outbox.Config
		commit bool
	}{
		{"rollback", outbox.Config{}, false},
		{"rollback-nolock", outbox.Config{DisableAggregateLock: true}, false},
		{"commit", outbox.Config{}, true},
		{"commit-nonotify", outbox.Config{DisableNotify: true}, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			db, p := benchProducer(b, bc.cfg)
			ctx := context.Background()
			ev := benchEvents(1)[0]
			for b.Loop() {
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := p.Emit(ctx, tx, ev); err != nil {
					b.Fatal(err)
				}
				if bc.commit {
					err = tx.Commit(ctx)
				} else {
					err = tx.Rollback(ctx)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEmitBatch is one EmitBatch per op in a rolled-back transaction;
// ns/event is the figure to compare with BenchmarkEmit/rollback.
func BenchmarkEmitBatch(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			db, p := benchProducer(b, outbox.Config{})
			ctx := context.Background()
			evs := benchEvents(n)
			for b.Loop() {
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					if _, err := p.EmitBatch(ctx, tx, evs); err != nil {
						return err
					}
					return errRollback
				})
				if !errors.Is(err, errRollback) {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}

// errRollback makes pgx.BeginFunc roll back.
var errRollback = errors.New("rollback")
