package relay_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// publishSignal tells the test each time a publish returned.
type publishSignal struct {
	relay.Sink
	published chan int
}

func (p *publishSignal) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := p.Sink.Publish(ctx, msgs)
	p.published <- len(msgs)
	return errs
}

// pipelinedCommits counts the COMMITs a pool sent in a pipeline (a batch)
// and on their own.
type pipelinedCommits struct{ inBatch, alone atomic.Int64 }

func (c *pipelinedCommits) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if data.SQL == "COMMIT" {
		c.alone.Add(1)
	}
	return ctx
}

func (c *pipelinedCommits) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *pipelinedCommits) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *pipelinedCommits) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if data.SQL == "COMMIT" && data.Err == nil {
		c.inBatch.Add(1)
	}
}

func (c *pipelinedCommits) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A batch whose rows were all acknowledged commits in one pipeline with
// the relayer's next claim, which follows within the busy poll. Every
// batch is still committed and reported once, in order, and a relayer
// stopped in the pause before that claim commits the batch before Run
// returns.
func TestAcknowledgedBatchCommitsWithTheNextClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	commits := &pipelinedCommits{}
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = commits
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var (
		mu         sync.Mutex
		dispatched int
	)
	sig := &publishSignal{published: make(chan int, 100)}
	r := b.relayer(t, func(c *relay.Config) {
		c.Pool = pool
		c.BusyPollInterval = 9 * time.Millisecond // a pause the COMMIT waits out (at most 10ms)
		c.Hooks = append(c.Hooks, onBatch(func(res relay.BatchResult) {
			mu.Lock()
			dispatched += res.Dispatched
			mu.Unlock()
		}))
		sig.Sink = c.Sink
		c.Sink = sig
	})
	stop := run(t, r)
	awaitPublish := func() {
		t.Helper()
		select {
		case <-sig.published:
		case <-time.After(10 * time.Second):
			t.Fatal("the relayer published nothing within 10s")
		}
	}

	const events = 6
	agg := uuid.New()
	for i := range events - 1 {
		b.emit(t, agg, "order.placed", map[string]int{"n": i})
		awaitPublish()
	}
	b.waitDrained(t, 10*time.Second)
	require.Positive(t, commits.inBatch.Load(), "no batch committed in one pipeline with the next claim")

	// Stop in the pause after a publish: the batch's COMMIT waits for a
	// claim that never comes, so the stop commits it.
	b.emit(t, agg, "order.placed", map[string]int{"n": events - 1})
	awaitPublish()
	time.Sleep(3 * time.Millisecond)
	stop()
	require.Zero(t, b.pending(t), "the batch published before the stop was committed")
	require.EqualValues(t, events, r.Stats().Dispatched)
	mu.Lock()
	require.Equal(t, events, dispatched, "every batch reported once, after its commit")
	mu.Unlock()
	recs := b.consume(t, events, 30*time.Second, "order")
	require.Len(t, recs, events)
	checkOrder(t, recs)
}

// The claim goes in a pipeline (pgx.Batch) with its BEGIN and the previous
// batch's COMMIT, whatever the pool's query mode: poolers in transaction
// mode need one without named prepared statements.
func TestClaimPipelineWorksInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg, err := pgxpool.ParseConfig(b.db.URL)
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			r := b.relayer(t, func(c *relay.Config) { c.Pool = pool; c.BatchSize = 50 })
			run(t, r)
			const events = 120
			b.preload(t, events, 7, "order.placed") // full batches: pipelined claims
			b.waitDrained(t, 30*time.Second)
			agg := uuid.New()
			for i := range 5 { // small batches: COMMIT with the next claim
				b.emit(t, agg, "order.placed", map[string]int{"n": i})
				time.Sleep(5 * time.Millisecond)
			}
			b.waitDrained(t, 30*time.Second)
			recs := b.consume(t, events+5, 30*time.Second, "order")
			checkOrder(t, recs)
		})
	}
}
