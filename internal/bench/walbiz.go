package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cputime"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// walLSNSQL is the WAL write position in bytes, for the WAL a stretch of
// work wrote (pg_current_wal_lsn() deltas).
const walLSNSQL = `SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint`

// walInsertLSNSQL is the WAL insert position in bytes: every commit that
// returned before it is behind it.
const walInsertLSNSQL = `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint`

// deadTuplesSQL reads the outbox's dead tuples and how often autovacuum
// has vacuumed it (the cumulative statistics view; no index).
const deadTuplesSQL = `SELECT coalesce(n_dead_tup, 0), coalesce(autovacuum_count, 0) FROM pg_stat_user_tables WHERE relid = $1::regclass`

// flushStatsSQL makes the session report its table statistics when it
// next goes idle, not up to 10 s later.
const flushStatsSQL = `SELECT pg_stat_force_next_flush()`

// sentLSNSQL is how far the walsender reading slot $1 has decoded and
// sent, in bytes; -1 while nobody reads it (catalog views, no index).
const sentLSNSQL = `SELECT coalesce((SELECT (r.sent_lsn - '0/0'::pg_lsn)::bigint
  FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
  WHERE s.slot_name = $1), -1)`

// heartbeatSQL is the WAL relayer's heartbeat (a non-transactional logical
// message it acknowledges at once): written while a WAL-mode cleanup waits
// for the slot to confirm its starting position, so that it does not wait
// for the relayer's own heartbeat.
const heartbeatSQL = `SELECT pg_logical_emit_message(false, '` + walrelay.HeartbeatPrefix + `', '')`

func (e *env) intQuery(ctx context.Context, sql string, args ...any) (int64, error) {
	var v int64
	err := e.pool.QueryRow(ctx, sql, args...).Scan(&v)
	return v, err
}

// lsnString formats a WAL position as Postgres prints it.
func lsnString(lsn int64) string {
	return fmt.Sprintf("%X/%X", uint64(lsn)>>32, uint32(lsn))
}

// walMode is one way of writing events for the WAL source, with the
// producer configuration a user of that mode would set.
type walMode struct {
	key, name string
	cfg       outbox.Config // Tables set by the caller
}

func walModes() []walMode {
	return []walMode{
		{"insert", "ModeInsert (row; lock and NOTIFY off)", outbox.Config{Mode: outbox.ModeInsert, DisableAggregateLock: true, DisableNotify: true}},
		{"insert_delete", "ModeInsertDelete (row deleted in the tx)", outbox.Config{Mode: outbox.ModeInsertDelete}},
		{"message", "ModeMessage (logical message, no row)", outbox.Config{Mode: outbox.ModeMessage}},
	}
}

// bizReader is what reads the outbox while the business writers run.
type bizReader int

const (
	readNone        bizReader = iota
	readPoll                  // the polling relay
	readRecvlogical           // pg_recvlogical on a slot
	readWAL                   // the WAL relay
)

// bizRun is one row of the business table.
type bizRun struct {
	key, name string
	emit      bool // false: the orders insert alone
	cfg       outbox.Config
	mode      string // the walMode key; "" for the polling rows
	reader    bizReader
}

func bizRuns(tables outbox.Tables) []bizRun {
	runs := []bizRun{
		{key: "none", name: "orders insert only (no outbox)"},
		{key: "emit", name: "polling: + Emit (defaults: lock + NOTIFY), no relay", emit: true, cfg: outbox.Config{Tables: tables}},
		{key: "poll", name: "polling: + Emit (defaults), polling relay draining", emit: true, cfg: outbox.Config{Tables: tables}, reader: readPoll},
	}
	for _, m := range walModes() {
		cfg := m.cfg
		cfg.Tables = tables
		runs = append(runs,
			bizRun{key: m.key + ".none", name: m.name + ", no slot", emit: true, cfg: cfg, mode: m.key},
			bizRun{key: m.key + ".recvlogical", name: m.name + ", pg_recvlogical reading the slot", emit: true, cfg: cfg, mode: m.key, reader: readRecvlogical},
			bizRun{key: m.key + ".wal", name: m.name + ", WAL relay streaming", emit: true, cfg: cfg, mode: m.key, reader: readWAL},
		)
	}
	return runs
}

// bizOutcome is what one row measured.
type bizOutcome struct {
	txs, relayed int64
	elapsed      time.Duration
	catchUp      time.Duration
	lat          []time.Duration
	// walBytes is the WAL written from the writers' start until the
	// reader had caught up (the writers' end without one).
	walBytes int64
	// dead is the outbox's n_dead_tup once caught up; autovacuums counts
	// autovacuum's runs on it meanwhile.
	dead, autovacuums int64
	cleanup           *cleanupCost // nil: nothing to clean up
	// batches is how many batches the relayer published, window and
	// catch-up.
	batches int64
	// processCPU is this process's CPU time from the writers' start until
	// caught up: the writers' client side, and the relayer and dev broker
	// when the row has them; walsenderCPU the slot's walsender's (0 when
	// not on this machine).
	processCPU, walsenderCPU time.Duration
}

// cleanupCost is what removing the window's events from the table cost
// once relayed: cleanup's deletes (ops.Cleanup) and the VACUUM that
// reclaims their space.
type cleanupCost struct {
	deleted                int64
	deleteWAL, vacuumWAL   int64
	deleteTime, vacuumTime time.Duration
}

func (c *cleanupCost) wal() int64 {
	if c == nil {
		return 0
	}
	return c.deleteWAL + c.vacuumWAL
}

// walBusiness runs the writers for window with no outbox, with the polling
// outbox (no relay, and the polling relay), and with each WAL mode alone,
// read by pg_recvlogical and by the WAL relay; rounds times, the rows
// interleaved (every other round in reverse order, so that a drift of the
// machine's load favours no row), reporting each row's median round.
func walBusiness(ctx context.Context, s *session, e *env, res *Result, window time.Duration, rounds int, recv string, recvErr error) error {
	runs := bizRuns(e.tables)
	t := Table{Title: fmt.Sprintf("business transactions while relaying (%d writers, %d rounds of %s per row, median round)", s.cfg.Writers, rounds, window),
		Columns: []string{"run", "tx/s", "vs no outbox", "vs pg_recvlogical", "WAL B/event (window)", "dead tuples after",
			"cleanup WAL B/event", "cleanup s (delete + vacuum)", "WAL B/event, whole life", "relayed in window", "caught up after", "events/batch",
			"process CPU µs/tx", "walsender CPU µs/event"}}
	outcomes := make([][]bizOutcome, len(runs))
	for round := range rounds {
		order := make([]int, len(runs))
		for i := range order {
			order[i] = i
			if round%2 == 1 {
				order[i] = len(runs) - 1 - i
			}
		}
		for _, i := range order {
			r := runs[i]
			if r.reader == readRecvlogical && recvErr != nil {
				continue
			}
			s.progress("wal: business: round %d/%d: %s", round+1, rounds, r.name)
			o, err := bizOnce(ctx, s, e, r, window, recv)
			if err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			outcomes[i] = append(outcomes[i], o)
		}
	}
	var base float64
	recvTx := map[string]float64{}
	for i, r := range runs {
		if r.reader == readRecvlogical && recvErr != nil {
			t.Rows = append(t.Rows, []string{r.name, "not run: " + recvErr.Error(), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"})
			continue
		}
		o := medianRound(outcomes[i])
		tx := perSecond(o.txs, o.elapsed)
		if r.key == "none" {
			base = tx
		}
		if r.reader == readRecvlogical {
			recvTx[r.mode] = tx
		}
		vsRecv := "-"
		if r.reader == readRecvlogical || r.reader == readWAL {
			if rt, ok := recvTx[r.mode]; ok {
				vsRecv = ratio(tx / rt)
				res.metric("wal.business."+r.key+".vs_recvlogical", tx/rt)
			}
		}
		perEvent := float64(o.walBytes) / float64(max(o.txs, 1))
		whole := float64(o.walBytes+o.cleanup.wal()) / float64(max(o.txs, 1))
		dead, cleanWAL, cleanTime, wholeCell := "-", "-", "-", "-"
		if r.emit {
			dead = thousands(o.dead)
			if o.autovacuums > 0 {
				dead += fmt.Sprintf(" (%d autovacuum)", o.autovacuums)
			}
			res.metric("wal.business."+r.key+".dead_tuples", float64(o.dead))
		}
		if r.reader == readPoll || r.reader == readWAL {
			wholeCell = strconv.FormatFloat(whole, 'f', 0, 64)
			res.metric("wal.business."+r.key+".wal_bytes_per_event_life", whole)
			if c := o.cleanup; c != nil {
				cleanWAL = strconv.FormatFloat(float64(c.wal())/float64(max(o.txs, 1)), 'f', 0, 64)
				cleanTime = fmt.Sprintf("%.2f + %.2f", c.deleteTime.Seconds(), c.vacuumTime.Seconds())
				res.metric("wal.business."+r.key+".cleanup_wal_bytes_per_event", float64(c.wal())/float64(max(o.txs, 1)))
				res.metric("wal.business."+r.key+".cleanup_s", (c.deleteTime + c.vacuumTime).Seconds())
			} else {
				cleanWAL, cleanTime = "0", "nothing to clean"
			}
		}
		relayed, caught := "-", "-"
		if r.reader != readNone {
			caught = strconv.FormatFloat(o.catchUp.Seconds(), 'f', 2, 64) + " s"
			res.metric("wal.business."+r.key+".catch_up_s", o.catchUp.Seconds())
		}
		if r.reader == readPoll || r.reader == readWAL {
			relayed = thousands(o.relayed)
			res.metric("wal.business."+r.key+".relayed", float64(o.relayed))
		}
		perBatch, sender := "-", "-"
		if o.batches > 0 {
			perBatch = strconv.FormatFloat(float64(o.txs)/float64(o.batches), 'f', 1, 64)
			res.metric("wal.business."+r.key+".events_per_batch", float64(o.txs)/float64(o.batches))
		}
		if o.walsenderCPU > 0 {
			sender = strconv.FormatFloat(float64(o.walsenderCPU.Microseconds())/float64(max(o.txs, 1)), 'f', 0, 64)
			res.metric("wal.business."+r.key+".walsender_cpu_us_per_event", float64(o.walsenderCPU.Microseconds())/float64(max(o.txs, 1)))
		}
		cpuPerTx := float64(o.processCPU.Microseconds()) / float64(max(o.txs, 1))
		res.metric("wal.business."+r.key+".process_cpu_us_per_tx", cpuPerTx)
		t.Rows = append(t.Rows, []string{r.name, rate(tx), ratio(tx / base), vsRecv, strconv.FormatFloat(perEvent, 'f', 0, 64), dead,
			cleanWAL, cleanTime, wholeCell, relayed, caught, perBatch, strconv.FormatFloat(cpuPerTx, 'f', 0, 64), sender})
		res.metric("wal.business."+r.key+".tx_per_s", tx)
		res.metric("wal.business."+r.key+".ratio", tx/base)
		res.metric("wal.business."+r.key+".wal_bytes_per_event", perEvent)
		if r.key == "insert.wal" {
			// The stable keys of the WAL relay's row: plain INSERT.
			res.metric("wal.business.wal.tx_per_s", tx)
			res.metric("wal.business.wal.ratio", tx/base)
			res.metric("wal.business.wal.relayed", float64(o.relayed))
		}
	}
	res.Tables = append(res.Tables, t)
	return nil
}

// medianRound is the round whose tx/s is the median (the lower middle one
// of an even count).
func medianRound(rounds []bizOutcome) bizOutcome {
	sorted := slices.Clone(rounds)
	slices.SortFunc(sorted, func(a, b bizOutcome) int {
		return cmp.Compare(perSecond(a.txs, a.elapsed), perSecond(b.txs, b.elapsed))
	})
	return sorted[(len(sorted)-1)/2]
}

// bizOnce runs one row: fresh tables, the reader (if any) started and
// caught up with an empty outbox, the writers for window, then the time
// the reader needs to take in what is left, the dead tuples, and what
// cleaning up the relayed rows costs.
func bizOnce(ctx context.Context, s *session, e *env, r bizRun, window time.Duration, recv string) (o bizOutcome, err error) {
	if err := e.resetBizTables(ctx); err != nil {
		return o, err
	}
	fn, err := bizEmitter(r)
	if err != nil {
		return o, err
	}
	var b *broker
	if r.reader == readPoll || r.reader == readWAL {
		if b, err = s.startBroker(); err != nil {
			return o, err
		}
		defer b.close()
	}
	var slot string
	if r.reader == readRecvlogical || r.reader == readWAL {
		// The named result, not a shadow: the slot's teardown error joins it.
		var serr error
		if slot, serr = e.setupSlot(ctx); serr != nil {
			return o, serr
		}
		defer func() { err = errors.Join(err, e.teardownSlot(context.WithoutCancel(ctx), slot)) }()
	}
	rd, err := e.startBizReader(ctx, s, r, b, slot, recv)
	if err != nil {
		return o, err
	}
	defer rd.release()
	av0, err := e.measureWindow(ctx, s, rd, slot, window, fn, &o)
	if err != nil {
		return o, err
	}
	if r.emit {
		// The polling relay's backends count its UPDATEs' dead tuples: stop
		// it (its sessions report at exit) before reading them. The WAL
		// relay writes nothing to the table, and confirms the slot cleanup
		// waits for.
		if r.reader == readPoll {
			if err := rd.stopNow(); err != nil {
				return o, err
			}
		}
		if err := e.measureAftermath(ctx, r, slot, av0, &o); err != nil {
			return o, err
		}
	}
	return o, rd.stopNow()
}

// resetBizTables empties the orders and the outbox, gives autovacuum back
// to the outbox, and vacuums, so that no row starts with another's dead
// tuples.
func (e *env) resetBizTables(ctx context.Context) error {
	if err := e.exec(ctx, "TRUNCATE orders, "+e.tables.OutboxIdent()); err != nil {
		return err
	}
	if err := e.exec(ctx, "ALTER TABLE "+e.tables.OutboxIdent()+" RESET (autovacuum_enabled)"); err != nil {
		return err
	}
	return e.vacuum(ctx)
}

// bizEmitter is the business transaction of the row: the orders insert,
// and one event emitted with the row's producer configuration if it has an
// outbox.
func bizEmitter(r bizRun) (func(ctx context.Context, tx pgx.Tx, n int) error, error) {
	if !r.emit {
		return emitTx(nil, emitVariant{}), nil
	}
	p, err := outbox.NewProducer(r.cfg)
	if err != nil {
		return nil, err
	}
	return emitTx(p, emitVariant{events: 1}), nil
}

// bizReading is the reader of a business row, once started and caught up
// with the empty outbox.
type bizReading struct {
	// relayed and batches count what the relayer published (nil: the
	// reader does not count them).
	relayed, batches func() int64
	// catchUp waits until the reader has taken in the txs events written
	// before WAL position end (nil: no reader).
	catchUp func(txs, end int64) error
	stop    func() error // nil: no reader, or stopped already
	// release frees the reader on every path; after stop, a no-op.
	release func()
}

// stopNow stops the reader, once: a second call returns nil.
func (rd *bizReading) stopNow() error {
	stop := rd.stop
	rd.stop = nil
	if stop == nil {
		return nil
	}
	return stop()
}

// startBizReader starts the row's reader (on b and slot, as the reader
// needs) and waits until it reads from the empty outbox.
func (e *env) startBizReader(ctx context.Context, s *session, r bizRun, b *broker, slot, recv string) (*bizReading, error) {
	rd := &bizReading{release: func() {}}
	prefix := fmt.Sprintf("bench%s_%s_", e.id, randomID())
	switch r.reader {
	case readPoll:
		g, err := e.startRelayers(ctx, b, 1, prefix, false, nil)
		if err != nil {
			return nil, err
		}
		rd.release = func() { _ = g.stop() } // stopped by stopNow; a second stop is a no-op
		rd.relayed, rd.batches, rd.stop = g.dispatched.Load, g.batches.Load, g.stop
		rd.catchUp = func(txs, _ int64) error { _, err := g.waitFor(ctx, txs, drainTimeout(txs)); return err }
		time.Sleep(300 * time.Millisecond) // the first (empty) poll, and LISTEN
	case readWAL:
		w, err := e.startWALWith(ctx, b, prefix, 0, nil, r.mode == "message")
		if err != nil {
			return nil, err
		}
		if err := w.waitLeading(ctx); err != nil {
			_ = w.stop()
			return nil, err
		}
		rd.release = func() { _ = w.stop() } // stopped by stopNow; a second stop is a no-op
		rd.relayed, rd.stop = func() int64 { return w.r.Stats().Dispatched }, w.stop
		rd.batches = func() int64 { return w.r.Stats().Batches }
		rd.catchUp = func(txs, _ int64) error { _, err := w.waitFor(ctx, txs, drainTimeout(txs)); return err }
	case readRecvlogical:
		rl, err := startRecvlogical(ctx, recv, s.cfg.DatabaseURL, slot, slot, "")
		if err != nil {
			return nil, err
		}
		if err := e.awaitReader(ctx, slot, rl); err != nil {
			rl.kill()
			return nil, err
		}
		rd.release, rd.stop = rl.kill, rl.stop
		rd.catchUp = func(txs, end int64) error { return e.awaitSent(ctx, slot, end, rl, drainTimeout(txs)) }
	}
	return rd, nil
}

// measureWindow runs the writers for window and waits for the reader to
// catch up, recording in o what was written and relayed, the latencies,
// the WAL written, the batches and the CPU spent. It returns autovacuum's
// count on the outbox before the writers started.
func (e *env) measureWindow(ctx context.Context, s *session, rd *bizReading, slot string, window time.Duration, fn func(ctx context.Context, tx pgx.Tx, n int) error, o *bizOutcome) (av0 int64, err error) {
	e.checkpoint(ctx)
	lsn0, err := e.intQuery(ctx, walLSNSQL)
	if err != nil {
		return 0, err
	}
	if _, av0, err = e.deadTuples(ctx); err != nil {
		return 0, err
	}
	walsender := e.walsenderPID(ctx, slot)
	sender0, _ := cputime.Process(walsender)
	cpu0 := cputime.Self()
	if o.txs, o.lat, o.elapsed, err = runEmitters(ctx, e, s.cfg.Writers, window, fn); err != nil {
		return 0, err
	}
	slices.Sort(o.lat)
	end, err := e.intQuery(ctx, walInsertLSNSQL)
	if err != nil {
		return 0, err
	}
	if rd.relayed != nil {
		o.relayed = rd.relayed()
	}
	if rd.catchUp != nil {
		t0 := time.Now()
		if err := rd.catchUp(o.txs, end); err != nil {
			return 0, err
		}
		o.catchUp = time.Since(t0)
	}
	o.processCPU = cputime.Self() - cpu0
	if walsender != 0 {
		if sender1, err := cputime.Process(walsender); err == nil {
			o.walsenderCPU = sender1 - sender0
		}
	}
	if rd.batches != nil {
		o.batches = rd.batches()
	}
	lsn1, err := e.intQuery(ctx, walLSNSQL)
	if err != nil {
		return 0, err
	}
	o.walBytes = lsn1 - lsn0
	return av0, nil
}

// walsenderPID is the process id of the walsender reading slot when it
// runs on this machine, else 0 (and 0 for no slot).
func (e *env) walsenderPID(ctx context.Context, slot string) int {
	if slot == "" {
		return 0
	}
	if pid, err := e.intQuery(ctx, activePIDSQL, slot); err == nil && pid != 0 && isWalsender(int(pid)) {
		return int(pid)
	}
	return 0
}

// measureAftermath records in o the dead tuples the row left in the
// outbox, autovacuum's runs since av0, and what cleaning up the relayed
// rows costs. Autovacuum is off on the outbox from here on: it would race
// the measured cleanup.
func (e *env) measureAftermath(ctx context.Context, r bizRun, slot string, av0 int64, o *bizOutcome) error {
	if err := e.exec(ctx, "ALTER TABLE "+e.tables.OutboxIdent()+" SET (autovacuum_enabled = false)"); err != nil {
		return err
	}
	dead, av1, err := e.settledDeadTuples(ctx)
	if err != nil {
		return err
	}
	o.dead, o.autovacuums = dead, av1-av0
	if r.reader == readPoll || r.reader == readWAL {
		if o.cleanup, err = e.cleanUp(ctx, r, slot); err != nil {
			return err
		}
	}
	return nil
}

// awaitReader waits until pg_recvlogical streams from slot.
func (e *env) awaitReader(ctx context.Context, slot string, rl *recvlogical) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := rl.running(); err != nil {
			return err
		}
		sent, err := e.intQuery(ctx, sentLSNSQL, slot)
		if err != nil {
			return err
		}
		if sent >= 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pg_recvlogical did not start streaming slot %s within 15s: %s", slot, rl.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitSent waits until the walsender reading slot has decoded and sent
// the WAL up to end: pg_recvlogical has been given every event before it.
func (e *env) awaitSent(ctx context.Context, slot string, end int64, rl *recvlogical, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		sent, err := e.intQuery(ctx, sentLSNSQL, slot)
		if err != nil {
			return err
		}
		if sent >= end {
			return nil
		}
		if err := rl.running(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the walsender of pg_recvlogical sent up to %s of %s within %s", lsnString(sent), lsnString(end), timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// deadTuples reads the outbox's n_dead_tup and autovacuum count.
func (e *env) deadTuples(ctx context.Context) (dead, autovacuums int64, err error) {
	err = e.pool.QueryRow(ctx, deadTuplesSQL, e.tables.OutboxIdent()).Scan(&dead, &autovacuums)
	return dead, autovacuums, err
}

// settledDeadTuples reads them once every session of the env's pool has
// reported its statistics: each is told to report when it goes idle
// (the writers' last second would otherwise show up to 10 s later), and
// the sessions that ended (the polling relay's) report as they exit.
func (e *env) settledDeadTuples(ctx context.Context) (dead, autovacuums int64, err error) {
	for _, c := range e.pool.AcquireAllIdle(ctx) {
		_, ferr := c.Exec(ctx, flushStatsSQL)
		c.Release()
		if ferr != nil {
			return 0, 0, ferr
		}
	}
	time.Sleep(300 * time.Millisecond)
	return e.deadTuples(ctx)
}

// cleanUp removes the relayed rows as a deployment would, and measures the
// WAL and time of each step: ops.Cleanup's deletes (batches of its
// default size, with the pause between them left out of the time; WAL
// mode waits for the slot to confirm first, which is not timed), then a
// VACUUM of the outbox, which reclaims the dead tuples (of the deletes,
// and of the polling relay's UPDATEs, or ModeInsertDelete's deletes).
// Rows of a ModeMessage outbox: none.
func (e *env) cleanUp(ctx context.Context, r bizRun, slot string) (*cleanupCost, error) {
	if r.mode == "message" {
		return nil, nil
	}
	c := &cleanupCost{}
	if r.mode != "insert_delete" {
		cfg := ops.CleanupConfig{Tables: e.tables, Retention: time.Microsecond, SkipProcessed: true, Pause: time.Nanosecond, Logger: e.s.cfg.Logger}
		if r.reader == readWAL {
			cfg.Source = ops.WAL(slot)
			cfg.WALConfirmWait = 30 * time.Second
		}
		beat := func() {}
		if r.reader == readWAL {
			beat = e.heartbeats(ctx, 100*time.Millisecond)
		}
		l0, err := e.intQuery(ctx, walLSNSQL)
		if err != nil {
			beat()
			return nil, err
		}
		cr, err := ops.Cleanup(ctx, e.pool, cfg)
		beat()
		if err != nil {
			return nil, fmt.Errorf("cleanup: %w", err)
		}
		l1, err := e.intQuery(ctx, walLSNSQL)
		if err != nil {
			return nil, err
		}
		c.deleted, c.deleteWAL, c.deleteTime = cr.Outbox.Deleted, l1-l0, cr.Outbox.Duration
	}
	l0, err := e.intQuery(ctx, walLSNSQL)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := e.exec(ctx, "VACUUM "+e.tables.OutboxIdent()); err != nil {
		return nil, fmt.Errorf("vacuum: %w", err)
	}
	c.vacuumTime = time.Since(t0)
	l1, err := e.intQuery(ctx, walLSNSQL)
	if err != nil {
		return nil, err
	}
	c.vacuumWAL = l1 - l0
	return c, nil
}

// heartbeats writes the WAL relayer's heartbeat every d until the returned
// function is called.
func (e *env) heartbeats(ctx context.Context, d time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			_ = e.exec(ctx, heartbeatSQL)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}
