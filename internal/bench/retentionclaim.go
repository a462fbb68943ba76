package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The cleanup scenario's second table: what partitions cost the relay's
// claim. The same rows, 30 days of them with a backlog pending in the
// newest, in one partition and in 30 (one a day), and in the plain table
// for reference; the relayer's own claim statement, read off the wire,
// run in its own transaction settings many times over, the layouts
// interleaved.

// claimLayout is one outbox the claim is timed on.
type claimLayout struct {
	key, name string
	// prepare migrates e's outbox in this layout for n ids from first
	// on; nil for the plain migration newEnv applies.
	prepare func(ctx context.Context, e *env, first, n int64) error
}

func claimLayouts() []claimLayout {
	return []claimLayout{
		{key: "plain", name: "plain table"},
		{key: "partitions_1", name: "partitioned, 1 partition", prepare: func(ctx context.Context, e *env, first, n int64) error {
			return partitionOutbox(ctx, e, n, first, first+n)
		}},
		{key: "partitions_30", name: "partitioned, 30 partitions (a day each)", prepare: func(ctx context.Context, e *env, first, n int64) error {
			return partitionOutbox(ctx, e, n/claimDays, first, first+n)
		}},
	}
}

// claimDays is how many days of events the claim's outboxes hold.
const claimDays = 30

// claimBatch is the batch the timed claims take, as in the scale
// scenario: small enough that the claim's fixed costs (planning, one
// descent per partition) show.
const claimBatch = 1000

// claimTarget is one layout's outbox and the relayer's claim on it.
type claimTarget struct {
	l     claimLayout
	e     *env
	claim capturedClaim
	// conn holds the claim prepared as claimStmt, for EXPLAIN ANALYZE
	// EXECUTE; nil until the first.
	conn  *pgxpool.Conn
	times []time.Duration
	plan  []float64 // planning ms, EXPLAIN ANALYZE
	exec  []float64 // execution ms, EXPLAIN ANALYZE
}

// retentionClaims fills an outbox per claim layout, times the claim on
// each, and adds the table.
func retentionClaims(ctx context.Context, cs *session, res *Result) error {
	short := cs.cfg.Short
	perDay, pending := pick(short, int64(1_000), int64(20_000)), pick(short, int64(5_000), int64(50_000))
	reps, explains := pick(short, 10, 300), pick(short, 3, 30)
	res.param("claim", "%s events a day over %d days (%s), the newest %s pending, in each layout; the relayer's claim statement as it sends it (read off the wire, with its transaction's SET LOCALs), batch %s, %d times per layout in rolled-back transactions, the layouts interleaved; median and p90 of the claim's round trip; planning and execution time: medians of %d EXPLAIN ANALYZE EXECUTE runs of the claim prepared on one connection, as pgx prepares the relayer's, in its transaction settings (a partitioned outbox is claimed with a generic plan: planned once per connection, then looked up)",
		thousands(perDay), claimDays, thousands(perDay*claimDays), thousands(pending), thousands(claimBatch), reps, explains)
	var anchor time.Time
	if err := cs.admin.QueryRow(ctx, retentionAnchorSQL).Scan(&anchor); err != nil {
		return err
	}
	var targets []*claimTarget
	defer func() {
		for _, t := range targets {
			if t.conn != nil {
				t.conn.Release()
			}
			t.e.close()
		}
	}()
	for _, l := range claimLayouts() {
		e, err := cs.newEnv(ctx, "claim_"+l.key, 2)
		if err != nil {
			return err
		}
		t := &claimTarget{l: l, e: e}
		targets = append(targets, t)
		// Ids from n on, a multiple of every layout's partition width, so
		// that the partitions hold the rows and nothing else.
		n := perDay * claimDays
		if err := e.exec(ctx, startIDsSQL, e.tables.OutboxIdent(), n); err != nil {
			return err
		}
		if l.prepare != nil {
			if err := l.prepare(ctx, e, n, n); err != nil {
				return fmt.Errorf("%s: %w", l.name, err)
			}
		}
		// Before the fill: the relayer that shows its claim would
		// otherwise dispatch the first pending rows.
		if t.claim, err = captureClaim(ctx, e); err != nil {
			return fmt.Errorf("%s: %w", l.name, err)
		}
		if err := fillDays(ctx, e, "cleanup: claim: "+l.key, anchor, claimDays, n, pending); err != nil {
			return fmt.Errorf("%s: %w", l.name, err)
		}
		if err := e.vacuum(ctx); err != nil {
			return err
		}
	}
	cs.progress("cleanup: claim: %d claims per layout", reps)
	for range reps {
		for _, t := range targets {
			d, err := t.timeOne(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", t.l.name, err)
			}
			t.times = append(t.times, d)
		}
	}
	for range explains {
		for _, t := range targets {
			if err := t.explainOne(ctx); err != nil {
				return fmt.Errorf("%s: EXPLAIN ANALYZE: %w", t.l.name, err)
			}
		}
	}
	claimTable(res, targets)
	return nil
}

// timeOne runs the claim once in a transaction that is rolled back, so
// every run claims the same rows, and returns the claim's round trip.
func (t *claimTarget) timeOne(ctx context.Context) (time.Duration, error) {
	tx, err := t.e.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // rolled back on purpose
	for _, q := range t.claim.setup {
		if _, err := tx.Exec(ctx, q); err != nil {
			return 0, err
		}
	}
	t0 := time.Now()
	rows, err := tx.Query(ctx, t.claim.sql, claimBatch, []int64{}, 4<<20)
	if err != nil {
		return 0, fmt.Errorf("claim: %w", err)
	}
	got := 0
	for rows.Next() {
		got++
	}
	rows.Close()
	d := time.Since(t0)
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("claim: %w", err)
	}
	if got < claimBatch {
		return 0, fmt.Errorf("the claim returned %d rows; want %d (the pending rows are missing)", got, claimBatch)
	}
	return d, nil
}

// claimStmt is the name the claim is prepared under for EXPLAIN ANALYZE
// EXECUTE, and claimExplainSQL runs it with the timed claims' arguments.
const (
	claimStmt       = "bench_claim"
	claimExplainSQL = "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE " + claimStmt + "(%d, '{}', %d)"
)

// explainOne runs the claim under EXPLAIN (ANALYZE) in a transaction that
// is rolled back and records its planning and execution times. The claim
// is a statement prepared on one connection, as the relayer's pgx
// prepares it, and run with the relayer's SET LOCALs: its plan is then
// the one the relayer gets, custom and planned each run on a plain table,
// generic and planned once per connection on a partitioned one (where
// planning is the cached plan's lookup after the first run).
func (t *claimTarget) explainOne(ctx context.Context) error {
	if t.conn == nil {
		c, err := t.e.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		t.conn = c
		if _, err := c.Conn().Prepare(ctx, claimStmt, t.claim.sql); err != nil {
			return fmt.Errorf("prepare the claim: %w", err)
		}
	}
	tx, err := t.conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // rolled back on purpose
	for _, q := range t.claim.setup {
		if _, err := tx.Exec(ctx, q); err != nil {
			return err
		}
	}
	var out []byte
	if err := tx.QueryRow(ctx, fmt.Sprintf(claimExplainSQL, claimBatch, 4<<20)).Scan(&out); err != nil {
		return err
	}
	var plans []struct {
		Planning  float64 `json:"Planning Time"`
		Execution float64 `json:"Execution Time"`
	}
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		return fmt.Errorf("read EXPLAIN's JSON: %v", err)
	}
	t.plan = append(t.plan, plans[0].Planning)
	t.exec = append(t.exec, plans[0].Execution)
	return nil
}

// claimTable adds the claim's table and metrics; the ratios are to the
// one-partition layout when it was measured, else to the first.
func claimTable(res *Result, targets []*claimTarget) {
	t := Table{Title: fmt.Sprintf("the relay's claim (batch %s) by layout", thousands(claimBatch)),
		Columns: []string{"layout", "claim p50 ms", "claim p90 ms", "vs one partition", "planning ms", "execution ms"}}
	base := targets[0]
	for _, x := range targets {
		if x.l.key == "partitions_1" {
			base = x
		}
	}
	baseP50 := percentile(sortedCopy(base.times), 50)
	for _, x := range targets {
		times := sortedCopy(x.times)
		p50, p90 := percentile(times, 50), percentile(times, 90)
		r := float64(p50) / float64(baseP50)
		key := "cleanup.claim." + x.l.key + "."
		res.metric(key+"p50_ms", float64(p50)/float64(time.Millisecond))
		res.metric(key+"p90_ms", float64(p90)/float64(time.Millisecond))
		res.metric(key+"ratio", r)
		res.metric(key+"planning_ms", median(x.plan))
		res.metric(key+"execution_ms", median(x.exec))
		t.Rows = append(t.Rows, []string{x.l.name, ms(p50), ms(p90), ratio(r),
			fmt.Sprintf("%.2f", median(x.plan)), fmt.Sprintf("%.2f", median(x.exec))})
	}
	res.Tables = append(res.Tables, t)
}

func sortedCopy(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s
}
