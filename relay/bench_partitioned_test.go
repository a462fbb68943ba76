package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
)

// claimLayout is an outbox shaped as a week of a partitioned outbox looks
// to the claim: dispatched rows (benchDispatched) spread over partitions-1
// partitions (none: the plain layout), the backlog in the last partition.
type claimLayout struct {
	name       string
	partitions int // 0: plain
}

const benchDispatched = 290_000

// layoutDB makes the outbox of l, with benchDispatched dispatched rows and
// pending pending rows after them, vacuumed and analyzed.
func layoutDB(b *testing.B, l claimLayout, pending int) *pgtest.DB {
	b.Helper()
	ctx := context.Background()
	db := pgtest.New(b, pgtest.Options{MaxConns: 4, Partitioned: l.partitions > 0, PartitionWidth: 1 << 40, PartitionedIDs: 1})
	if l.partitions > 0 {
		// Replace the partitions the layout made (ids 0 to 3 * 2^40) by
		// partitions-1 equal ones over the dispatched rows and one for
		// the rest.
		ps, err := partition.List(ctx, db.Pool, db.Tables.OutboxIdent())
		must(b, err)
		for _, p := range ps {
			_, err := db.Pool.Exec(ctx, "DROP TABLE "+pgident.Qualified(db.Tables.Schema, p.Name))
			must(b, err)
		}
		var from int64
		for i := 0; i < l.partitions-1; i++ {
			width := int64(benchDispatched/(l.partitions-1)) + 1
			_, err := partition.Add(ctx, db.Pool, db.Tables, db.Tables.Outbox, from, from+width)
			must(b, err)
			from += width
		}
		_, err = partition.Add(ctx, db.Pool, db.Tables, db.Tables.Outbox, from, 1<<50)
		must(b, err)
	}
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_id, type, payload, dispatched_at)
		SELECT md5('aggregate-' || (g %% 1000))::uuid, 'order.placed',
		  jsonb_build_object('order_id', g, 'customer_id', 'customer-' || (g %% 1000), 'total_cents', (g * 7919) %% 100000, 'currency', 'EUR'),
		  CASE WHEN g <= $1::bigint THEN now() END
		FROM generate_series(1, $1::bigint + $2::bigint) g`, db.Tables.OutboxIdent()), benchDispatched, pending)
	must(b, err)
	_, err = db.Pool.Exec(ctx, "VACUUM ANALYZE "+db.Tables.OutboxIdent())
	must(b, err)
	return db
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkClaimPartitioned is BenchmarkClaim (one relayer draining a
// backlog; ns/op is one batch: claim, mark, commit) on the plain layout
// and on a partitioned outbox of 1 and of 30 partitions, with 290,000
// dispatched rows in front of the backlog, at full batches of 1,000 and
// at batches of 10, where a claim's planning (which grows with the
// partitions) weighs most. Run it with a fixed count, each layout is made
// afresh per run:
//
//	go test -run '^$' -bench ClaimPartitioned -benchtime 200x ./relay/
func BenchmarkClaimPartitioned(b *testing.B) {
	for _, batch := range []int{1000, 10} {
		for _, l := range []claimLayout{{"plain", 0}, {"partitions=1", 1}, {"partitions=30", 30}} {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, l.name), func(b *testing.B) {
				db := layoutDB(b, l, b.N*batch)
				drainBatches(b, db, batch)
			})
		}
	}
}

// drainBatches times one relayer draining b.N batches of batch rows.
func drainBatches(b *testing.B, db *pgtest.DB, batch int) {
	var dispatched atomic.Int64
	r, err := relay.New(relay.Config{Common: relay.Common{Pool: db.Pool, Sink: ackAll{}, Tables: db.Tables, BatchSize: batch,
		Logger: slog.New(slog.DiscardHandler),
		Hooks:  []relay.Hook{onBatch(func(res relay.BatchResult) { dispatched.Add(int64(res.Dispatched)) })}}})
	must(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.ResetTimer()
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(time.Minute + time.Duration(b.N)*time.Second)
	for dispatched.Load() < int64(b.N*batch) {
		if time.Now().After(deadline) {
			b.Fatalf("dispatched %d of %d events", dispatched.Load(), b.N*batch)
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	cancel()
	must(b, <-done)
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
}
