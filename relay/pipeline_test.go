package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// stallingPublisher holds its first Publish until the relayer has claimed
// the next batch beside it (a second claim statement completed),
// then fails one row of it; it logs the ids of every Publish call.
type stallingPublisher struct {
	relay.Sink
	claimed func() bool // the next batch is claimed
	failAt  int         // index of the row the first call fails
	fail    error       // with this error

	mu    sync.Mutex
	calls [][]int64
	saw2  bool
}

func (p *stallingPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	p.mu.Lock()
	first := len(p.calls) == 0
	ids := make([]int64, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	p.calls = append(p.calls, ids)
	p.mu.Unlock()
	if first {
		deadline := time.Now().Add(10 * time.Second)
		for !p.claimed() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		p.mu.Lock()
		p.saw2 = p.claimed()
		p.mu.Unlock()
	}
	errs := p.Sink.Publish(ctx, msgs)
	if first {
		errs[p.failAt] = p.fail
	}
	return errs
}

// claimCounter counts the claim statements a pool completed.
type claimCounter struct{ done atomic.Int64 }

type claimKey struct{}

func (c *claimCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "SKIP LOCKED") {
		return context.WithValue(ctx, claimKey{}, true)
	}
	return ctx
}

func (c *claimCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if ctx.Value(claimKey{}) != nil && data.Err == nil {
		c.done.Add(1)
	}
}

// The relayer sends its claim in a pipeline with the BEGIN: pgx traces it
// as a batch.
func (c *claimCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *claimCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if strings.Contains(data.SQL, "SKIP LOCKED") && data.Err == nil {
		c.done.Add(1)
	}
}

func (c *claimCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// While a full batch is being published the relayer claims the next one;
// when a row of the first batch is not acknowledged (a transient error) or
// refused for good (a permanent one), the next batch, which holds later rows
// of the same aggregate, must be rolled back unpublished: the second Publish
// starts again at the failed row, never past it.
func TestPipelinedBatchIsDroppedWhenThePreviousOneFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"transient", errors.New("injected: broker did not acknowledge this record")},
		{"permanent", relay.Permanent(errors.New("injected: broker refused this record"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const events, batch, failAt = 3_000, 1_000, 500
			b := setup(t)
			b.preload(t, events, 1, "order.placed") // one aggregate: every batch follows the previous one
			claims := &claimCounter{}
			cfg, err := pgxpool.ParseConfig(b.db.URL)
			require.NoError(t, err)
			cfg.ConnConfig.Tracer = claims
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			pub := &stallingPublisher{failAt: failAt, fail: tc.err, claimed: func() bool { return claims.done.Load() >= 2 }}
			r := b.relayer(t, func(c *relay.Config) {
				c.Pool = pool
				c.BatchSize = batch
				c.HoldOut = 100 * time.Millisecond
				pub.Sink = c.Sink
				c.Sink = pub
			})
			run(t, r)
			b.waitDrained(t, 30*time.Second)

			pub.mu.Lock()
			calls, saw2 := pub.calls, pub.saw2
			pub.mu.Unlock()
			require.True(t, saw2, "the relayer did not claim a second batch while publishing the first")
			require.GreaterOrEqual(t, len(calls), 2)
			require.Len(t, calls[0], batch)
			require.Equal(t, calls[0][failAt], calls[1][0],
				"after row %d of the first batch failed, the next publish must start with it, not with the batch claimed meanwhile", calls[0][failAt])

			recs := b.consume(t, events+batch-failAt, 30*time.Second, "order")
			checkOrder(t, recs)
			distinct := map[int64]bool{}
			for _, rec := range recs {
				distinct[rec.EventID] = true
			}
			require.Len(t, distinct, events)
			require.Len(t, recs, events+batch-failAt, "exactly the unacknowledged suffix of the first batch is sent twice")
		})
	}
}

// With pipelining off a relayer claims only after its batch committed.
func TestDisablePipeliningKeepsOneTransaction(t *testing.T) {
	t.Parallel()
	const events, batch = 3_000, 500
	b := setup(t)
	b.preload(t, events, 10, "order.placed")
	pool, app := b.appPool(t, 4)
	var most int
	var mu sync.Mutex
	r := b.relayer(t, func(c *relay.Config) {
		c.Pool = pool
		c.BatchSize = batch
		c.DisablePipelining = true
		c.Hooks = append(c.Hooks, onBatch(func(relay.BatchResult) {
			var n int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(),
				"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND xact_start IS NOT NULL", app).Scan(&n))
			mu.Lock()
			most = max(most, n)
			mu.Unlock()
		}))
	})
	run(t, r)
	b.waitDrained(t, 30*time.Second)
	checkOrder(t, b.consume(t, events, 30*time.Second, "order"))
	mu.Lock()
	defer mu.Unlock()
	// A BatchHook runs after the commit: with pipelining the next batch's
	// transaction would be open by then.
	require.Zero(t, most, "a relayer with pipelining off had a transaction open after its batch committed")
}
