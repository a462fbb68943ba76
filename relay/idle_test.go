package relay_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// statementCounter counts the claims and the pending probes a pool's
// connections send.
type statementCounter struct{ claims, probes atomic.Int64 }

func (c *statementCounter) count(sql string) {
	switch {
	case strings.HasPrefix(sql, "WITH held AS"):
		c.claims.Add(1)
	case strings.HasPrefix(sql, "SELECT EXISTS (SELECT 1 FROM"):
		c.probes.Add(1)
	}
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The claim goes in a pipeline with its BEGIN.
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *statementCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.count(d.SQL)
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// An idle relayer's polls ask whether anything is pending before they
// claim: while nothing is, it sends probes and no claim; once a row is
// pending, the next poll claims and publishes it.
func TestIdlePollProbesBeforeItClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var count statementCounter
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 2
	cfg.ConnConfig.Tracer = &count
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r := b.relayer(t, func(c *relay.Config) { c.Pool, c.PollOnly, c.PollInterval = pool, true, 20*time.Millisecond })
	run(t, r)

	require.Eventually(t, func() bool { return count.probes.Load() >= 10 }, 20*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(1), count.claims.Load(), "only the claim at start: the idle polls found nothing pending")
	b.emit(t, uuid.New(), "order.placed", map[string]int{"n": 1})
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 20*time.Second, 5*time.Millisecond)
	require.Greater(t, count.claims.Load(), int64(1))
}
