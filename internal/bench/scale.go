package bench

import (
	"context"
	"errors"
	"fmt"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/relay"
)

func runScale(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	pending := pick(cfg.Short, 5_000, 50_000)
	claims := pick(cfg.Short, 10, 50)
	e, err := s.newEnv(ctx, "scale", 4)
	if err != nil {
		return nil, err
	}
	defer e.close()

	claimSQL, err := captureClaimSQL(ctx, e)
	if err != nil {
		return nil, err
	}

	res := &Result{}
	res.param("levels", "%s dispatched rows in the table (filler: INSERT ... SELECT generate_series in one statement, ids below the pending rows', then VACUUM ANALYZE)", joinCounts(cfg.ScaleRows))
	res.param("pending", "%s events over %s aggregates at every level", thousands(int64(pending)), thousands(int64(cfg.Aggregates)))
	res.param("claim", "the relayer's own claim statement (batch 1,000), %d times in rolled-back transactions; median and p90 of the round trip", claims)
	res.param("relay", "one relayer (defaults) draining the pending events to the broker")

	t := Table{Title: "cost as dispatched rows pile up", Columns: []string{"dispatched rows", "table size", "claim p50 ms", "claim p90 ms", "claim vs empty", "relay ev/s", "relay vs empty", "preload s"}}
	var baseClaim, baseRate float64
	var have int64
	for i, level := range cfg.ScaleRows {
		fill, size, err := fillLevel(ctx, s, e, level, &have, pending)
		if err != nil {
			return nil, err
		}

		s.progress("scale: %d claims at %d dispatched rows", claims, level)
		times, err := timeClaims(ctx, e, claimSQL, claims)
		if err != nil {
			return nil, err
		}
		p50, p90 := percentile(times, 50), percentile(times, 90)

		b, err := s.startBroker()
		if err != nil {
			return nil, err
		}
		s.progress("scale: relay drain of %d events at %d dispatched rows", pending, level)
		d, err := e.drainWithRelayers(ctx, b, 1, int64(pending), nil)
		b.close()
		if err != nil {
			return nil, fmt.Errorf("relay at %d dispatched rows: %w", level, err)
		}
		have += int64(pending)
		claimMS := float64(p50) / float64(time.Millisecond)
		if i == 0 {
			baseClaim, baseRate = claimMS, d.rate()
		}
		t.Rows = append(t.Rows, []string{thousands(level), size, ms(p50), ms(p90), ratio(claimMS / baseClaim), rate(d.rate()), ratio(d.rate() / baseRate), fmt.Sprintf("%.1f", fill.Seconds())})
		key := fmt.Sprintf("scale.%d.", level)
		res.metric(key+"claim_p50_ms", claimMS)
		res.metric(key+"relay_events_per_s", d.rate())
		res.metric(key+"dispatched", float64(d.events))
	}
	res.Tables = append(res.Tables, t)
	top := cfg.ScaleRows[len(cfg.ScaleRows)-1]
	r := res.Metrics[fmt.Sprintf("scale.%d.claim_p50_ms", top)] / baseClaim
	res.target(fmt.Sprintf("claim at %s dispatched rows", thousands(top)), "<= 1.2x the claim on an empty table", fmt.Sprintf("%.2fx (%.2f vs %.2f ms)", r, res.Metrics[fmt.Sprintf("scale.%d.claim_p50_ms", top)], baseClaim), r <= 1.2)
	if top < 10_000_000 {
		res.note("the target is at 10M dispatched rows; this run stopped at %s (pass --scale-rows 0,1000000,10000000)", thousands(top))
	}
	return res, nil
}

// fillLevel brings the table to level dispatched rows (have is how many it
// holds) and preloads pending events, then reports how long that took and
// the table's size.
func fillLevel(ctx context.Context, s *session, e *env, level int64, have *int64, pending int) (time.Duration, string, error) {
	cfg := s.cfg
	t0 := time.Now()
	// The previous level's drained events are dispatched rows too.
	if add := level - *have; add > 0 {
		s.progress("scale: adding %d dispatched rows", add)
		if err := e.exec(ctx, fmt.Sprintf(fillerSQL, e.tables.OutboxIdent()), add, cfg.Aggregates); err != nil {
			return 0, "", fmt.Errorf("fill %d dispatched rows: %w", add, err)
		}
		*have = level
	}
	if err := e.preload(ctx, pending, cfg.Aggregates); err != nil {
		return 0, "", err
	}
	if err := e.vacuum(ctx); err != nil {
		return 0, "", err
	}
	e.checkpoint(ctx)
	fill := time.Since(t0)
	var size string
	if err := e.pool.QueryRow(ctx, "SELECT pg_size_pretty(pg_total_relation_size($1::regclass))", e.tables.OutboxIdent()).Scan(&size); err != nil {
		return 0, "", err
	}
	return fill, size, nil
}

func joinCounts(vs []int64) string {
	var out []string
	for _, v := range vs {
		out = append(out, thousands(v))
	}
	return strings.Join(out, " / ")
}

// timeClaims runs the claim n times, each in a transaction that is rolled
// back, so every run claims the same 1,000 rows, and returns the sorted
// round-trip times.
func timeClaims(ctx context.Context, e *env, claimSQL string, n int) ([]time.Duration, error) {
	var times []time.Duration
	for range n {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		rows, err := tx.Query(ctx, claimSQL, 1000, []int64{}, 4<<20)
		if err != nil {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("claim: %w", err)
		}
		var got int
		for rows.Next() {
			got++
		}
		rows.Close()
		d := time.Since(t0)
		if err := rows.Err(); err != nil {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("claim: %w", err)
		}
		if err := tx.Rollback(ctx); err != nil {
			return nil, err
		}
		if got == 0 {
			return nil, errors.New("the claim returned no rows; the pending preload is missing")
		}
		times = append(times, d)
	}
	slices.Sort(times)
	return times, nil
}

// captureClaimSQL returns the claim statement exactly as the relayer runs
// it, read off the wire: a relayer with a tracing pool runs one (empty)
// batch. The relay package keeps its SQL unexported; this measures what
// production runs without copying it.
func captureClaimSQL(ctx context.Context, e *env) (string, error) {
	c, err := captureClaim(ctx, e)
	return c.sql, err
}

// capturedClaim is the relayer's claim statement and the statements it
// sends before it in the claim's transaction (SET LOCAL of the planner
// settings the claim is written for).
type capturedClaim struct {
	sql   string
	setup []string
}

// captureClaim is captureClaimSQL with the claim transaction's settings.
func captureClaim(ctx context.Context, e *env) (capturedClaim, error) {
	tr := &claimTracer{found: make(chan capturedClaim, 1)}
	pcfg := e.pool.Config().Copy()
	pcfg.MaxConns = 1
	pcfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return capturedClaim{}, err
	}
	defer pool.Close()
	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: nullPublisher{}, Tables: e.tables, Logger: e.s.cfg.Logger}, PollOnly: true})
	if err != nil {
		return capturedClaim{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	select {
	case c := <-tr.found:
		cancel()
		<-done
		return c, nil
	case err := <-done:
		return capturedClaim{}, fmt.Errorf("capture the relayer's claim statement: relayer stopped: %v", err)
	case <-rctx.Done():
		<-done
		return capturedClaim{}, errors.New("capture the relayer's claim statement: no claim within 30s")
	}
}

// claimTracer picks the claim out of the relayer's queries: the statement
// that marks pending rows dispatched, locking them with SKIP LOCKED, and
// takes the batch size, the rows in flight and the byte budget. It keeps
// the SET LOCAL statements sent before it.
type claimTracer struct {
	once  sync.Once
	mu    sync.Mutex
	setup []string
	found chan capturedClaim
}

func (t *claimTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	t.saw(data.SQL, data.Args)
	return ctx
}

func (t *claimTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The relayer sends its claim in a pipeline with the transaction's BEGIN
// (and the previous batch's COMMIT): pgx traces it as a batch.

func (t *claimTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (t *claimTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	t.saw(data.SQL, data.Args)
}

func (t *claimTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (t *claimTracer) saw(sql string, args []any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if strings.HasPrefix(sql, "SET LOCAL ") && !slices.Contains(t.setup, sql) {
		t.setup = append(t.setup, sql)
	}
	if len(args) == 3 && strings.Contains(sql, "SKIP LOCKED") && strings.Contains(strings.ToUpper(sql), "SET DISPATCHED_AT") {
		t.once.Do(func() { t.found <- capturedClaim{sql: sql, setup: slices.Clone(t.setup)} })
	}
}

// nullPublisher acknowledges everything at once.
type nullPublisher struct{ fakesink.Kafka }

func (nullPublisher) Publish(_ context.Context, msgs []relay.Message) []error {
	return make([]error, len(msgs))
}
