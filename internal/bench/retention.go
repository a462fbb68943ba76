package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/ops"
)

// The cleanup scenario: what retention costs, by the plain table's
// batched DELETE and by dropping partitions, on the same rows under the
// same business load. An outbox is filled with events written at a steady
// rate over 9 days, nearly all dispatched, then retention keeping 7 days
// removes the oldest 2 through the real code path (ops.Cleanup), while a
// few writers run business transactions at a fixed rate.

// retentionSpan is how far back the filled events go, and retentionKeep
// how much of it retention keeps.
const (
	retentionSpan = 9 * 24 * time.Hour
	retentionKeep = 7 * 24 * time.Hour
)

// The business load during the scenario.
const (
	retentionWriters = 4
	retentionRate    = 400 // transactions a second, all writers together
	// retentionMinDuring is the fewest transactions the "during cleanup"
	// latencies are taken over: a cleanup shorter than that many slots of
	// the schedule is measured over the slots from its start.
	retentionMinDuring = 200
)

// cleanupRole is the role the measured cleanup connects as, so that
// pg_stat_statements tells its WAL apart from the business writers'.
const cleanupRole = "outbox_bench_cleanup"

// cleanupServerSettings are the throwaway cluster's: fsync on, as in
// production, so that the cleanup's WAL competes with the business
// commits' flushes; room for the WAL of a whole run without a checkpoint
// in the middle of a measurement; no autovacuum, so that the dead tuples
// are what the cleanup left and the VACUUM after it does all the work;
// pg_stat_statements for the WAL each role wrote.
var cleanupServerSettings = map[string]string{
	"fsync":                    "on",
	"shared_buffers":           "512MB",
	"max_wal_size":             "16GB",
	"checkpoint_timeout":       "1h",
	"autovacuum":               "off",
	"shared_preload_libraries": "pg_stat_statements",
	"max_connections":          "60",
}

// Statements of the scenario, all on catalog views or small tables.
const (
	// retentionAnchorSQL is the end of the filled span: the start of the
	// current day (UTC), so that day boundaries fall on the span's days.
	retentionAnchorSQL = `SELECT date_trunc('day', now(), 'UTC')`
	// retentionSinceSQL is how long ago $1 was, in microseconds.
	retentionSinceSQL = `SELECT (extract(epoch FROM now() - $1::timestamptz) * 1000000)::bigint`
	// pgssResetSQL empties pg_stat_statements, which the throwaway
	// cluster has in public (the scenario's pools have their own schema
	// as search_path).
	pgssResetSQL = `SELECT public.pg_stat_statements_reset()`
	// cleanupWALSQL sums the WAL the cleanup role's statements wrote.
	cleanupWALSQL = `SELECT coalesce(sum(wal_bytes), 0)::bigint, coalesce(sum(wal_fpi), 0)::bigint, coalesce(sum(calls), 0)::bigint
FROM public.pg_stat_statements WHERE userid = (SELECT oid FROM pg_roles WHERE rolname = $1)`
	// treeDeadTuplesSQL is n_dead_tup over the outbox and its partitions
	// (pg_partition_tree of a plain table has no rows).
	treeDeadTuplesSQL = `SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables
WHERE relid = $1::regclass OR relid IN (SELECT relid FROM pg_partition_tree($1::regclass))`
	// treeSizeSQL is the size of the outbox, its partitions and their
	// indexes.
	treeSizeSQL = `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
WHERE c.oid = $1::regclass OR c.oid IN (SELECT relid FROM pg_partition_tree($1::regclass))`
	// retentionCountSQL counts the filled rows (ids below $1) older than
	// $2 (a walk of the primary key).
	retentionCountSQL = `SELECT count(*) FROM %s WHERE id < $1 AND created_at < $2`
	// retentionLeftSQL counts, after the cleanup, the filled rows left,
	// those of them older than the cutoff $2, and the pending rows.
	retentionLeftSQL = `SELECT count(*) FILTER (WHERE id < $1), count(*) FILTER (WHERE id < $1 AND created_at < $2),
  count(*) FILTER (WHERE dispatched_at IS NULL) FROM %s`
	// startIDsSQL makes $2 the next id the sequence of the outbox $1
	// hands out.
	startIDsSQL = `SELECT setval(pg_get_serial_sequence($1, 'id'), $2, false)`
)

// retentionLayout is one way of storing the outbox, with its retention.
type retentionLayout struct {
	key, name string
	// prepare migrates e's outbox in this layout, ready for ids from
	// first on, perDay of them a day; nil for the plain migration newEnv
	// applies.
	prepare func(ctx context.Context, e *env, first, perDay int64) error
}

func retentionLayouts() []retentionLayout {
	return []retentionLayout{
		{key: "delete", name: "plain table, batched DELETE"},
		{key: "drop", name: "partitioned, a partition a day, DETACH CONCURRENTLY + DROP", prepare: func(ctx context.Context, e *env, first, perDay int64) error {
			// The 9 days, and 3 widths ahead: EnsurePartitions keeps 2, so
			// the one ops.Cleanup runs first makes none while measured.
			return partitionOutbox(ctx, e, perDay, first, first+(retentionDays+3)*perDay)
		}},
	}
}

// retentionArm is what one layout measured.
type retentionArm struct {
	fill      time.Duration
	size      int64 // the outbox with its indexes before the cleanup
	removed   int64 // filled rows older than the cutoff: what retention must remove
	deleted   int64 // as ops.Cleanup counted them
	took      time.Duration
	wal, fpi  int64 // the cleanup role's WAL bytes and full-page images; -1 when not measured
	calls     int64 // the cleanup role's statements
	serverWAL int64 // the server's WAL over the cleanup, business writers included
	dead      int64
	vacuum    time.Duration
	vacuumWAL int64
	base      []time.Duration
	during    []time.Duration
	extended  bool // the cleanup was shorter than retentionMinDuring slots
	business  int64
	// parts is what ops.Cleanup did to the partitions; nil for a plain
	// outbox.
	parts *ops.PartitionCleanup
}

func runRetention(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	if !tmppg.Available() {
		return nil, errors.New("the cleanup scenario runs on a throwaway cluster (its WAL figures need a server of their own) and needs initdb and pg_ctl on the PATH")
	}
	s.progress("cleanup: starting a throwaway cluster")
	c, err := tmppg.StartWith(ctx, tmppg.Options{Settings: cleanupServerSettings})
	if err != nil {
		return nil, fmt.Errorf("start the throwaway cluster: %w", err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			s.progress("cleanup: %v", err)
		}
	}()
	cs, err := s.on(ctx, c.URL())
	if err != nil {
		return nil, err
	}
	defer cs.admin.Close()
	res := &Result{}
	pgss := prepareRetentionServer(ctx, cs, res)
	retentionParams(ctx, cs, res, pgss)

	cost := Table{Title: fmt.Sprintf("retention keeping 7 of 9 days of %s events", thousands(retentionFillCount(cfg.CleanupEvents))),
		Columns: []string{"layout", "rows removed", "cleanup s", "cleanup WAL", "WAL vs DELETE", "server WAL during", "dead tuples after", "VACUUM s", "VACUUM WAL", "outbox size before", "fill s"}}
	biz := Table{Title: fmt.Sprintf("business transactions (%d tx/s) without and during the cleanup", retentionRate),
		Columns: []string{"layout", "p50 / p99 ms, no cleanup", "p50 / p99 ms, during cleanup", "p99 during / without"}}
	var deleteWAL int64
	for _, l := range retentionLayouts() {
		a, err := retentionRun(ctx, cs, l, pgss)
		if err != nil {
			return res, fmt.Errorf("%s: %w", l.name, err)
		}
		if l.key == "delete" {
			deleteWAL = a.wal
		}
		c, b := retentionRows(res, l, a, deleteWAL)
		cost.Rows, biz.Rows = append(cost.Rows, c), append(biz.Rows, b)
		res.Tables = []Table{cost, biz}
	}
	if err := retentionClaims(ctx, cs, res); err != nil {
		return res, fmt.Errorf("claim: %w", err)
	}
	retentionTargets(res)
	return res, nil
}

// prepareRetentionServer creates the cleanup's role and
// pg_stat_statements on the throwaway cluster; false, with a note, when
// the extension cannot be used.
func prepareRetentionServer(ctx context.Context, cs *session, res *Result) bool {
	if _, err := cs.admin.Exec(ctx, `CREATE ROLE `+cleanupRole+` LOGIN SUPERUSER`); err != nil {
		res.note("cleanup WAL not told apart from the writers': creating role %s failed (%v); the server's WAL over the cleanup is all there is", cleanupRole, err)
		return false
	}
	if _, err := cs.admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public"); err != nil {
		res.note("cleanup WAL not told apart from the writers': pg_stat_statements is not available (%v); the server's WAL over the cleanup is all there is", err)
		return false
	}
	return true
}

func retentionParams(ctx context.Context, cs *session, res *Result, pgss bool) {
	cfg := cs.cfg
	var version string
	_ = cs.admin.QueryRow(ctx, "SHOW server_version").Scan(&version)
	res.param("server", "throwaway cluster (internal/tmppg), Postgres %s, fsync=on, shared_buffers=512MB, max_wal_size=16GB and checkpoint_timeout=1h (no checkpoint inside a measurement), autovacuum=off, pg_stat_statements", version)
	res.param("fill", "%s events (--cleanup-events, rounded down to a multiple of 9; ids from the outbox's sequence, from a day's worth on) over %s aggregates, ~200-byte JSON payloads, created at a steady rate over the 9 days up to today's 00:00 UTC (as many each day, the first at its 00:00), each dispatched half a step after it was created but the newest %s (pending); INSERT ... SELECT generate_series in chunks; then VACUUM ANALYZE and CHECKPOINT. The same rows in every layout, one layout after the other",
		thousands(retentionFillCount(cfg.CleanupEvents)), thousands(int64(cfg.Aggregates)), thousands(retentionPending(retentionFillCount(cfg.CleanupEvents))))
	res.param("business", "%d writers at %d tx/s together: BEGIN; UPDATE accounts (one of %d rows, by primary key); Emit (defaults); COMMIT; latency from the start of the transaction's slot in the schedule to its COMMIT returning; 'no cleanup' is the %s before the cleanup (after 1 s of warm-up), 'during' the slots that began while ops.Cleanup ran (at least the first %d from its start)",
		retentionWriters, retentionRate, retentionAccounts, retentionBaseline(cfg.Short), retentionMinDuring)
	walHow := "pg_stat_statements' wal_bytes of the cleanup's role (" + cleanupRole + ": its own pool)"
	if !pgss {
		walHow = "not told apart: see the notes"
	}
	res.param("cleanup", "ops.Cleanup with its defaults (batches of %s rows, %s pauses, counted in its time), Retention 7 days from the span's end, processed_events left alone; cleanup WAL: %s; server WAL during: pg_current_wal_insert_lsn() over the cleanup, the writers' included; dead tuples: n_dead_tup over the outbox and its partitions once the writers stopped and every session reported; then VACUUM of the outbox (no writers), timed, with its WAL",
		thousands(ops.DefaultCleanupBatch), ops.DefaultCleanupPause, walHow)
}

// retentionPending is how many of the newest filled events stay pending.
func retentionPending(n int64) int64 { return max(1, min(n/10_000, 1000)) }

// retentionBaseline is how long the business load runs before the
// cleanup starts, warm-up excluded.
func retentionBaseline(short bool) time.Duration { return pick(short, time.Second, 20*time.Second) }

// retentionRun fills an outbox in layout l, runs the business load and the
// cleanup, and measures the aftermath.
func retentionRun(ctx context.Context, cs *session, l retentionLayout, pgss bool) (retentionArm, error) {
	var a retentionArm
	e, err := cs.newEnv(ctx, "cleanup_"+l.key, retentionWriters+4)
	if err != nil {
		return a, err
	}
	defer e.close()
	var anchor time.Time
	if err := e.pool.QueryRow(ctx, retentionAnchorSQL).Scan(&anchor); err != nil {
		return a, err
	}
	n := retentionFillCount(cs.cfg.CleanupEvents)
	// The filled ids start at a day's worth, so that a partition a day
	// wide, whose bounds are multiples of its width, holds one day.
	first := n / retentionDays
	if err := e.exec(ctx, startIDsSQL, e.tables.OutboxIdent(), first); err != nil {
		return a, err
	}
	if l.prepare != nil {
		if err := l.prepare(ctx, e, first, n/retentionDays); err != nil {
			return a, err
		}
	}
	t0 := time.Now()
	if err := retentionFill(ctx, e, l, n, anchor); err != nil {
		return a, err
	}
	a.fill = time.Since(t0)
	cutoff := anchor.Add(-retentionKeep)
	if err := e.pool.QueryRow(ctx, fmt.Sprintf(retentionCountSQL, e.tables.OutboxIdent()), first+n, cutoff).Scan(&a.removed); err != nil {
		return a, err
	}
	if err := e.pool.QueryRow(ctx, treeSizeSQL, e.tables.OutboxIdent()).Scan(&a.size); err != nil {
		return a, err
	}
	if err := retentionMeasure(ctx, e, l, anchor, pgss, &a); err != nil {
		return a, err
	}
	return a, retentionAftermath(ctx, e, l, first, n, cutoff, &a)
}

// retentionFill writes the scenario's n events, VACUUM ANALYZEs and
// checkpoints.
func retentionFill(ctx context.Context, e *env, l retentionLayout, n int64, anchor time.Time) error {
	if err := fillDays(ctx, e, "cleanup: "+l.key, anchor, retentionDays, n, retentionPending(n)); err != nil {
		return err
	}
	e.s.progress("cleanup: %s: VACUUM ANALYZE", l.key)
	if err := e.vacuum(ctx); err != nil {
		return err
	}
	e.checkpoint(ctx)
	return nil
}

// fillDays writes n events (a multiple of days) created at a steady rate
// over the days before end, the newest pending of them pending (see
// retentionFillSQL), in chunks, reporting progress under label.
func fillDays(ctx context.Context, e *env, label string, end time.Time, days, n, pending int64) error {
	perDay := n / days
	step := float64(24*time.Hour/time.Microsecond) / float64(perDay)
	from := end.Add(-time.Duration(days) * 24 * time.Hour)
	const chunk = 500_000
	for lo := int64(1); lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		e.s.progress("%s: filling events %s to %s of %s", label, thousands(lo), thousands(hi), thousands(n))
		if err := e.exec(ctx, fmt.Sprintf(retentionFillSQL, e.tables.OutboxIdent()), lo, hi, from, perDay, step, n-pending, e.s.cfg.Aggregates); err != nil {
			return fmt.Errorf("fill events %d to %d: %w", lo, hi, err)
		}
	}
	return nil
}

// retentionDays is retentionSpan in days, retentionKeepDays
// retentionKeep.
const (
	retentionDays     = int64(retentionSpan / (24 * time.Hour))
	retentionKeepDays = int64(retentionKeep / (24 * time.Hour))
)

// checkDropped checks that a partitioned outbox's cleanup dropped want
// partitions (a day each), kept none that was due and made none ahead
// (the scenario made them: making one would be measured with the drop).
// Nothing to check for a plain outbox (pc nil).
func checkDropped(pc *ops.PartitionCleanup, want int64) error {
	switch {
	case pc == nil:
		return nil
	case len(pc.Kept) > 0:
		return fmt.Errorf("ops.Cleanup kept partition %s (%s: %s); the scenario's rows are all dispatched", pc.Kept[0].Name, pc.Kept[0].Reason, pc.Kept[0].Detail)
	case int64(len(pc.Dropped)) != want:
		return fmt.Errorf("ops.Cleanup dropped %d partitions; want %d (a day each)", len(pc.Dropped), want)
	case len(pc.Ensure.Created) > 0:
		return fmt.Errorf("ops.Cleanup made %d partitions ahead while measured; the scenario should have made them before", len(pc.Ensure.Created))
	}
	return nil
}

// retentionFillCount is how many events the scenario fills for the
// configured count: a multiple of the days, so that every day holds as
// many.
func retentionFillCount(events int) int64 { return int64(events) / retentionDays * retentionDays }

// retentionFillSQL writes the filled events $1 to $2: $4 a day from $3
// on, one every $5 microseconds from each day's start, so that every day
// ends a step after its last event; each dispatched half a step after it
// was created (before the next one is created, so that no day boundary
// falls between a row's creation and its dispatch) unless beyond $6;
// over $7 aggregates. generate_series yields the rows in order and the
// INSERT draws each one's id from the sequence as it comes, so ids
// follow created_at, as a steady producer's do.
const retentionFillSQL = `INSERT INTO %s (aggregate_id, type, payload, created_at, dispatched_at)
SELECT md5('aggregate-' || (g %% $7))::uuid, 'order.placed',
  jsonb_build_object('order_id', g, 'customer_id', 'customer-' || (g %% $7), 'total_cents', (g * 7919) %% 100000,
    'currency', 'EUR', 'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (g %% 97), 'qty', 1 + g %% 5, 'price_cents', 1999))),
  t, CASE WHEN g <= $6 THEN t + $5::float8 / 2 * interval '1 microsecond' END
FROM generate_series($1::bigint, $2::bigint) g,
  LATERAL (SELECT $3::timestamptz + ((g - 1) / $4::bigint) * interval '24 hours' + ((g - 1) %% $4::bigint) * $5::float8 * interval '1 microsecond' AS t) c`

// retentionMeasure runs the business load, then the cleanup under it, and
// records the latencies, the cleanup's figures and its WAL.
func retentionMeasure(ctx context.Context, e *env, l retentionLayout, anchor time.Time, pgss bool, a *retentionArm) error {
	if err := e.exec(ctx, accountsDDL); err != nil {
		return err
	}
	if err := e.exec(ctx, accountsFillSQL, retentionAccounts); err != nil {
		return err
	}
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables})
	if err != nil {
		return err
	}
	cpool, err := retentionCleanupPool(ctx, e, pgss)
	if err != nil {
		return err
	}
	defer cpool.Close()
	e.checkpoint(ctx)
	if pgss {
		if err := e.exec(ctx, pgssResetSQL); err != nil {
			return err
		}
	}
	e.s.progress("cleanup: %s: business load, %s without cleanup", l.key, retentionBaseline(e.s.cfg.Short))
	load := startBizLoad(ctx, e.pool, p, retentionWriters, retentionRate)
	defer load.stop() //nolint:errcheck // stopped below; its error is reported there
	warm := load.start.Add(time.Second)
	if !load.waitUntil(warm.Add(retentionBaseline(e.s.cfg.Short))) {
		return load.failed()
	}
	since, err := e.intQuery(ctx, retentionSinceSQL, anchor)
	if err != nil {
		return err
	}
	ccfg := ops.CleanupConfig{Tables: e.tables, Retention: retentionKeep + time.Duration(since)*time.Microsecond, SkipProcessed: true, Logger: e.s.cfg.Logger}
	e.s.progress("cleanup: %s: ops.Cleanup under the business load", l.key)
	lsn0, err := e.intQuery(ctx, walInsertLSNSQL)
	if err != nil {
		return err
	}
	t0 := time.Now()
	cr, err := ops.Cleanup(ctx, cpool, ccfg)
	t1 := time.Now()
	if err != nil {
		return fmt.Errorf("ops.Cleanup: %w", err)
	}
	lsn1, err := e.intQuery(ctx, walInsertLSNSQL)
	if err != nil {
		return err
	}
	a.took, a.deleted, a.serverWAL, a.parts = t1.Sub(t0), cr.Outbox.Deleted, lsn1-lsn0, cr.Partitions
	if err := checkDropped(a.parts, retentionDays-retentionKeepDays); err != nil {
		return err
	}
	end := t1
	if n := len(load.between(t0, t1)); n < retentionMinDuring {
		a.extended = true
		if end, err = load.awaitSince(ctx, t0, retentionMinDuring); err != nil {
			return err
		}
	}
	if err := load.stop(); err != nil {
		return err
	}
	a.base, a.during, a.business = load.between(warm, t0), load.between(t0, end), load.committed()
	a.wal, a.fpi, a.calls = -1, -1, -1
	if pgss {
		if err := e.pool.QueryRow(ctx, cleanupWALSQL, cleanupRole).Scan(&a.wal, &a.fpi, &a.calls); err != nil {
			return fmt.Errorf("read pg_stat_statements: %w", err)
		}
	}
	return nil
}

// retentionCleanupPool is the pool ops.Cleanup runs on: as cleanupRole
// when pg_stat_statements is there to tell its WAL apart.
func retentionCleanupPool(ctx context.Context, e *env, pgss bool) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(e.s.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	if pgss {
		u, err := url.Parse(e.s.cfg.DatabaseURL)
		if err != nil {
			return nil, err
		}
		u.User = url.User(cleanupRole)
		if pcfg, err = pgxpool.ParseConfig(u.String()); err != nil {
			return nil, err
		}
	}
	pcfg.MaxConns = 2
	return pgxpool.NewWithConfig(ctx, pcfg)
}

// retentionAftermath reads the dead tuples the cleanup left, VACUUMs the
// outbox, and checks that exactly the rows older than cutoff are gone of
// the n filled from id first.
func retentionAftermath(ctx context.Context, e *env, l retentionLayout, first, n int64, cutoff time.Time, a *retentionArm) error {
	for _, c := range e.pool.AcquireAllIdle(ctx) {
		_, ferr := c.Exec(ctx, flushStatsSQL)
		c.Release()
		if ferr != nil {
			return ferr
		}
	}
	time.Sleep(300 * time.Millisecond)
	if err := e.pool.QueryRow(ctx, treeDeadTuplesSQL, e.tables.OutboxIdent()).Scan(&a.dead); err != nil {
		return err
	}
	e.s.progress("cleanup: %s: VACUUM", l.key)
	lsn0, err := e.intQuery(ctx, walInsertLSNSQL)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := e.exec(ctx, "VACUUM "+e.tables.OutboxIdent()); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	a.vacuum = time.Since(t0)
	lsn1, err := e.intQuery(ctx, walInsertLSNSQL)
	if err != nil {
		return err
	}
	a.vacuumWAL = lsn1 - lsn0
	var left, old, pending int64
	if err := e.pool.QueryRow(ctx, fmt.Sprintf(retentionLeftSQL, e.tables.OutboxIdent()), first+n, cutoff).Scan(&left, &old, &pending); err != nil {
		return err
	}
	switch {
	case old != 0:
		return fmt.Errorf("%d filled rows older than the cutoff %s are still there after the cleanup", old, cutoff.UTC().Format(time.RFC3339))
	case left != n-a.removed:
		return fmt.Errorf("%d filled rows left after the cleanup; want %d (%d filled, %d older than the cutoff)", left, n-a.removed, n, a.removed)
	case pending != retentionPending(n)+a.business:
		return fmt.Errorf("%d pending rows after the cleanup; want %d (%d filled pending, %d emitted by the business load)", pending, retentionPending(n)+a.business, retentionPending(n), a.business)
	}
	return nil
}

// retentionRows records an arm's metrics and returns its rows of the
// cost and business tables; deleteWAL is the DELETE arm's cleanup WAL,
// the base of "WAL vs DELETE".
func retentionRows(res *Result, l retentionLayout, a retentionArm, deleteWAL int64) (cost, biz []string) {
	key := "cleanup." + l.key + "."
	bp50, bp99 := percentile(a.base, 50), percentile(a.base, 99)
	dp50, dp99 := percentile(a.during, 50), percentile(a.during, 99)
	p99ratio := float64(dp99) / float64(bp99)
	for k, v := range map[string]float64{
		"removed": float64(a.removed), "deleted": float64(a.deleted), "cleanup_s": a.took.Seconds(), "server_wal_bytes": float64(a.serverWAL),
		"dead_tuples": float64(a.dead), "vacuum_s": a.vacuum.Seconds(), "vacuum_wal_bytes": float64(a.vacuumWAL), "fill_s": a.fill.Seconds(),
		"business_p99_ms": float64(bp99) / float64(time.Millisecond), "business_during_p99_ms": float64(dp99) / float64(time.Millisecond),
		"business_p99_ratio": p99ratio, "business_during_samples": float64(len(a.during)), "business_transactions": float64(a.business),
	} {
		res.metric(key+k, v)
	}
	if a.parts != nil {
		res.metric(key+"partitions_dropped", float64(len(a.parts.Dropped)))
	}
	wal, vs := "not measured", "-"
	if a.wal >= 0 {
		wal = walBytes(a.wal) + fmt.Sprintf(" (%s FPI, %s statements)", thousands(a.fpi), thousands(a.calls))
		res.metric(key+"wal_bytes", float64(a.wal))
		if deleteWAL > 0 {
			vs = strconv.FormatFloat(100*float64(a.wal)/float64(deleteWAL), 'g', 3, 64) + "%"
			res.metric(key+"wal_vs_delete", float64(a.wal)/float64(deleteWAL))
		}
	}
	during := ms(dp50) + " / " + ms(dp99) + fmt.Sprintf(" (%s tx)", thousands(int64(len(a.during))))
	if a.extended {
		during += ", the first " + strconv.Itoa(retentionMinDuring) + " from its start"
	}
	cost = []string{l.name, thousands(a.removed), fmt.Sprintf("%.2f", a.took.Seconds()), wal, vs, walBytes(a.serverWAL), thousands(a.dead),
		fmt.Sprintf("%.2f", a.vacuum.Seconds()), walBytes(a.vacuumWAL), walBytes(a.size), fmt.Sprintf("%.0f", a.fill.Seconds())}
	biz = []string{l.name, ms(bp50) + " / " + ms(bp99) + fmt.Sprintf(" (%s tx)", thousands(int64(len(a.base)))), during, ratio(p99ratio)}
	return cost, biz
}

// walBytes formats a byte count in the unit that keeps it readable: the
// figures of one table run from hundreds of bytes to gigabytes.
func walBytes(b int64) string {
	switch {
	case b < 1<<10:
		return thousands(b) + " B"
	case b < 1<<20:
		return strconv.FormatFloat(float64(b)/(1<<10), 'f', 1, 64) + " KiB"
	case b < 1<<30:
		return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB"
	}
	return strconv.FormatFloat(float64(b)/(1<<30), 'f', 2, 64) + " GiB"
}

// retentionTargets judges the partition drop against the DELETE, and
// the claim on 30 partitions against one.
func retentionTargets(res *Result) {
	m := res.Metrics
	if r, ok := m["cleanup.claim.partitions_30.ratio"]; ok {
		res.target("claim with 30 partitions", "<= 1.2x the claim with one partition, same rows",
			fmt.Sprintf("%.2fx (p50 %.2f vs %.2f ms; plain table %.2f ms)", r, m["cleanup.claim.partitions_30.p50_ms"], m["cleanup.claim.partitions_1.p50_ms"], m["cleanup.claim.plain.p50_ms"]), r <= 1.2)
	}
	if _, ok := m["cleanup.drop.cleanup_s"]; !ok {
		res.note("the partitioned layout was not measured: its targets (drop WAL <= 1%% of the DELETE's, 0 dead tuples, business p99 during cleanup <= 1.2x, claim with 30 partitions <= 1.2x one) are not judged")
		return
	}
	r := m["cleanup.drop.wal_vs_delete"]
	res.target("retention by partition drop: WAL", "<= 1% of the batched DELETE's WAL, same rows",
		fmt.Sprintf("%.3g%% (%s vs %s)", 100*r, walBytes(int64(m["cleanup.drop.wal_bytes"])), walBytes(int64(m["cleanup.delete.wal_bytes"]))), r <= 0.01)
	d := m["cleanup.drop.dead_tuples"]
	res.target("retention by partition drop: dead tuples", "0", fmt.Sprintf("%s (DELETE: %s)", thousands(int64(d)), thousands(int64(m["cleanup.delete.dead_tuples"]))), d == 0)
	p := m["cleanup.drop.business_p99_ratio"]
	res.target("business p99 during retention by partition drop", "<= 1.2x its p99 without cleanup, same run and layout",
		fmt.Sprintf("%.2fx (%.2f vs %.2f ms; DELETE: %.2fx)", p, m["cleanup.drop.business_during_p99_ms"], m["cleanup.drop.business_p99_ms"], m["cleanup.delete.business_p99_ratio"]), p <= 1.2)
}
