package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// Exactly-once for the polling relay (Common.ExactlyOnce). Each relayer
// holds one lane of the lanes table (migration 8) under a lease, and the
// broker transactional id that goes with it. A batch is claimed, marked
// dispatched and reserved in the lane's row in one database transaction,
// then published with the reservation's number as the lane's progress in
// one broker transaction. Whoever holds the lane next (the relayer itself
// after an unknown outcome, another after a crash or a stall) opens the
// lane, which fences every earlier holder, and compares the progress with
// the reservation: published, the rows stay dispatched; not, they return
// to pending. See sql.go for how other lanes keep off the aggregates of a
// reservation in flight.

// laneStatements are the exactly-once relayer's statements, rendered,
// and (orphans, live) those of a relayer without it.
type laneStatements struct {
	claim, timeout, renew, reserve, take, create, lock, release, ret string
	orphans, live                                                    string
}

func renderLanes(tables outbox.Tables, claim string) laneStatements {
	return laneStatements{
		claim: render(claim, tables), timeout: render(laneTimeoutSQL, tables),
		renew: render(laneRenewSQL, tables), reserve: render(laneReserveSQL, tables),
		take: render(laneTakeSQL, tables), create: render(laneCreateSQL, tables),
		lock: render(laneLockSQL, tables), release: render(laneReleaseSQL, tables),
		ret: render(laneReturnSQL, tables), orphans: render(laneOrphansSQL, tables),
		live: render(laneLiveSQL, tables),
	}
}

// lane is the lane a relayer holds: its number, the epoch it took it at,
// and its broker lane.
type lane struct {
	n     int
	epoch int64
	id    string // the broker lane's transactional id
	tx    Lane
	// settled is set when the lane's reservation was published and
	// committed but is still recorded (laneRenewSQL clears it).
	settled bool
}

var (
	// errLaneLost: another relayer took the lane (its epoch moved, or
	// the broker fenced this one); this relayer steps down.
	errLaneLost = errors.New("this relayer lost its lane to another")
	// errOutcomeUnknown: a reservation's fate is not known here; the lane
	// is opened again, and its progress tells.
	errOutcomeUnknown = errors.New("the outcome of the batch in flight is unknown")
)

// laneProgress is what a lane's broker transactions record.
type laneProgress struct {
	Seq int64 `json:"seq"`
}

// runLanes is Run with ExactlyOnce: one batch in flight at a time, each
// claimed and reserved, published in one broker transaction, then
// settled.
func (r *Relayer) runLanes(ctx, batchCtx context.Context) error {
	ts, err := r.cfg.TransactionalSink()
	if err != nil {
		return err
	}
	r.log.Info("relay started", "exactly_once", true, "batch_size", r.cfg.BatchSize, "lane_lease", r.cfg.LaneLease, "poll_interval", r.cfg.PollInterval)
	defer r.log.Info("relay stopped")
	var ln, prev *lane
	defer func() {
		if ln != nil {
			r.leaveLane(batchCtx, ln)
		}
	}()
	pace := newPacer(r.cfg)
	var adopted time.Time
	for ctx.Err() == nil {
		if time.Since(adopted) >= r.cfg.LaneLease {
			adopted = time.Now()
			r.adoptOrphans(batchCtx, ts, cmp.Or(ln, prev))
		}
		if ln == nil {
			if ln, err = r.takeLane(batchCtx, ts, prev, false); err != nil {
				if !r.backOff(ctx, pace, fmt.Errorf("take a lane: %w", err)) {
					return nil
				}
				continue
			}
			prev = nil
		}
		res, full, err := r.laneBatch(batchCtx, ln, pace.claimSize())
		if err == nil {
			a, wait := pace.afterBatch(res, full, false)
			if a != claimNow && ln.settled {
				err = r.renewLane(batchCtx, ln)
			}
			if err == nil {
				if !r.lanePause(ctx, a, wait) {
					return nil
				}
				continue
			}
		}
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return nil
		}
		ln, prev = r.afterLaneError(ln, err)
		if !r.backOff(ctx, pace, err) {
			return nil
		}
	}
	return nil
}

// afterLaneError lets go of the broker lane after an error that leaves
// its state in doubt: with an unknown outcome the relayer takes the same
// lane again (prev) and recovers it; with the lane lost, it steps down
// and takes any lane.
func (r *Relayer) afterLaneError(ln *lane, err error) (cur, prev *lane) {
	switch {
	case errors.Is(err, errLaneLost):
		r.obs.Lane(LaneEvent{Kind: LaneLost, Lane: ln.id, Err: err})
		r.log.Warn("relay stepping down: another relayer took its lane; nothing it had in flight becomes visible", "lane", ln.n, "epoch", ln.epoch, "err", err)
		ln.tx.Close()
		return nil, nil
	case errors.Is(err, errOutcomeUnknown):
		ln.tx.Close()
		return nil, ln
	}
	return ln, nil
}

// lanePause is pause, cut short at a third of the lease so that an idle
// relayer renews its lane in time (its next claim does).
func (r *Relayer) lanePause(ctx context.Context, a action, wait time.Duration) bool {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.LaneLease/3)
	defer cancel()
	r.pause(pctx, a, wait)
	return ctx.Err() == nil
}

// owner names this relayer in the lanes table, for operators.
func owner() string {
	host, _ := os.Hostname()
	return host + "/" + strconv.Itoa(os.Getpid())
}

// takeLane takes a lane (prev again if it is still this relayer's, else
// a free one, else a new one; with adopt, only an orphan: a lane whose
// lease expired with a reservation left, and nil when there is none),
// opens its broker lane, which fences the lane's earlier holders, and
// recovers its reservation.
func (r *Relayer) takeLane(ctx context.Context, ts TransactionalSink, prev *lane, adopt bool) (*lane, error) {
	ln := &lane{}
	prevN, prevEpoch := -1, int64(-1)
	if prev != nil {
		prevN, prevEpoch = prev.n, prev.epoch
	}
	lease := r.cfg.LaneLease.Microseconds()
	for {
		err := r.cfg.Pool.QueryRow(ctx, r.lanes.take, owner(), lease, prevN, prevEpoch, adopt).Scan(&ln.n, &ln.epoch)
		if errors.Is(err, pgx.ErrNoRows) && !adopt {
			err = r.cfg.Pool.QueryRow(ctx, r.lanes.create, owner(), lease).Scan(&ln.n, &ln.epoch)
			if errors.Is(err, pgx.ErrNoRows) {
				continue // another relayer added the same lane: take the next
			}
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		break
	}
	if prev != nil && (ln.n != prevN || ln.epoch != prevEpoch+1) { // another relayer held prev meanwhile
		r.obs.Lane(LaneEvent{Kind: LaneLost, Lane: prev.id, Err: errLaneLost})
		r.log.Warn("relay stepping down: another relayer took its lane while its last batch's outcome was unknown; that relayer settled the batch, and nothing this one had in flight becomes visible", "lane", prevN, "epoch", prevEpoch, "new_lane", ln.n)
	}
	id := r.cfg.LaneID(fmt.Sprint("poll-", ln.n))
	tx, progress, err := ts.OpenLane(ctx, id)
	if err != nil {
		r.releaseLane(ctx, ln)
		return nil, fmt.Errorf("open lane %s: %w", id, err)
	}
	ln.tx = tx
	published, returned, err := r.recoverLane(ctx, ln, progress)
	if err != nil {
		tx.Close()
		return nil, err
	}
	ln.id = id
	r.obs.Lane(LaneEvent{Kind: LaneOpened, Lane: id, Published: published, Returned: returned})
	r.log.Info("relay took a lane", "lane", ln.n, "epoch", ln.epoch, "transactional_id", id, "adopted", adopt)
	return ln, nil
}

// recoverLane settles the reservation a lane was left with, by the
// progress its last committed broker transaction recorded: a reservation
// numbered up to it reached the broker, and its rows stay dispatched; a
// later one did not, and its rows return to pending. Then the lane has no
// reservation. It returns how many of the reservation's rows were
// published and how many it returned to pending.
func (r *Relayer) recoverLane(ctx context.Context, ln *lane, progress []byte) (published, returned int64, err error) {
	var p laneProgress
	if progress != nil {
		if err := json.Unmarshal(progress, &p); err != nil {
			return 0, 0, fmt.Errorf("lane %d: its progress record %q is not this relayer's ({\"seq\": N}): is TransactionalID shared with another program? Give this outbox its own", ln.n, clipBytes(progress))
		}
	}
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("recover lane %d: %w", ln.n, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	var seq int64
	var ids []int64
	if err := tx.QueryRow(ctx, r.lanes.lock, ln.n, ln.epoch).Scan(&seq, &ids); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, 0, fmt.Errorf("recover lane %d: %w", ln.n, errLaneLost)
		}
		return 0, 0, fmt.Errorf("recover lane %d: %w", ln.n, err)
	}
	if len(ids) > 0 && p.Seq < seq {
		tag, err := tx.Exec(ctx, r.lanes.ret, ids)
		if err != nil {
			return 0, 0, fmt.Errorf("recover lane %d: return %d rows to pending: %w", ln.n, len(ids), err)
		}
		returned = tag.RowsAffected()
	}
	if _, err := tx.Exec(ctx, r.lanes.renew, ln.n, ln.epoch, r.cfg.LaneLease.Microseconds()); err != nil {
		return 0, 0, fmt.Errorf("recover lane %d: %w", ln.n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("recover lane %d: %w", ln.n, err)
	}
	if p.Seq >= seq {
		published = int64(len(ids))
	}
	if len(ids) > 0 {
		r.log.Info("relay recovered a lane's batch in flight", "lane", ln.n, "reservation", seq, "progress", p.Seq,
			"published", p.Seq >= seq, "rows", len(ids), "returned_to_pending", returned)
	}
	return published, returned, nil
}

func clipBytes(b []byte) []byte { return b[:min(len(b), 100)] }

// renewLane extends the lane's lease and clears its settled reservation.
func (r *Relayer) renewLane(ctx context.Context, ln *lane) error {
	tag, err := r.cfg.Pool.Exec(ctx, r.lanes.renew, ln.n, ln.epoch, r.cfg.LaneLease.Microseconds())
	if err != nil {
		return fmt.Errorf("renew lane %d: %w", ln.n, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("renew lane %d: %w", ln.n, errLaneLost)
	}
	ln.settled = false
	return nil
}

// releaseLane ends the lane's lease (best effort: it expires anyway).
func (r *Relayer) releaseLane(ctx context.Context, ln *lane) {
	if _, err := r.cfg.Pool.Exec(context.WithoutCancel(ctx), r.lanes.release, ln.n, ln.epoch); err != nil {
		r.log.Warn("relay could not release its lane; it is free once its lease expires", "lane", ln.n, "err", err)
	}
}

// leaveLane is a stop's: a settled reservation is cleared and the lane
// released for the next relayer. A reservation in doubt is not here (the
// lane was dropped), so a lane left is always clean.
func (r *Relayer) leaveLane(ctx context.Context, ln *lane) {
	ctx = context.WithoutCancel(ctx)
	if ln.settled {
		if err := r.renewLane(ctx, ln); err != nil {
			ln.tx.Close()
			return
		}
	}
	r.releaseLane(ctx, ln)
	ln.tx.Close()
}

// maxAdoptions bounds the orphans one relayer adopts at a time.
const maxAdoptions = 4

// adoptOrphans takes each lane whose holder died or stalled with a
// reservation in flight (its lease expired), fences the holder, settles
// the reservation and releases the lane: until then the reservation's
// aggregates wait.
func (r *Relayer) adoptOrphans(ctx context.Context, ts TransactionalSink, own *lane) {
	for range maxAdoptions {
		ln, err := r.takeLane(ctx, ts, own, true)
		if err != nil {
			r.log.Warn("relay could not adopt an orphan lane; it tries again in a lease", "err", err)
			return
		}
		if ln == nil {
			return
		}
		r.log.Info("relay adopted an orphan lane: its holder's lease expired with a batch in flight", "lane", ln.n, "epoch", ln.epoch)
		r.releaseLane(ctx, ln)
		ln.tx.Close()
	}
}

// laneBatch claims, reserves, publishes and settles one batch. full says
// whether the claim took as many rows as it asked for.
func (r *Relayer) laneBatch(ctx context.Context, ln *lane, size int) (BatchResult, bool, error) {
	c, err := r.laneClaim(ctx, ln, size)
	if err != nil {
		return BatchResult{}, false, err
	}
	res := BatchResult{Locked: c.locked, Claimed: len(c.msgs)}
	if len(c.msgs) == 0 {
		if err := c.tx.Commit(ctx); err != nil {
			return res, false, fmt.Errorf("commit an empty claim: %w", err)
		}
		ln.settled = false
		r.report(c, res)
		return res, false, nil
	}
	errs, send, sendIdx, holds, seq, err := r.laneReserve(ctx, ln, c)
	if err != nil {
		return res, false, err
	}
	ln.settled = false
	if len(send) > 0 {
		progress, _ := json.Marshal(laneProgress{Seq: seq})
		perrs, err := r.obs.PublishLane(ctx, ln.tx, send, progress)
		switch {
		case err == nil:
			ln.settled = true
		case errors.Is(err, ErrAborted):
			r.obs.Lane(LaneEvent{Kind: LaneAborted, Lane: ln.id, Err: err})
			var more []Hold
			if perrs, more, err = r.laneAborted(ctx, ln, send, perrs); err != nil {
				return res, false, err
			}
			holds = append(holds, more...)
		case errors.Is(err, ErrFenced):
			return res, false, fmt.Errorf("publish %d rows: %w: %w", len(send), errLaneLost, err)
		default:
			return res, false, fmt.Errorf("publish %d rows: %w: %w", len(send), errOutcomeUnknown, err)
		}
		for j, i := range sendIdx {
			errs[i] = nil
			if len(perrs) == len(send) {
				errs[i] = perrs[j]
			}
		}
	}
	return r.laneReport(c, res, errs, holds)
}

// laneReport counts a settled batch, logs its holds and reports it; it
// fails, for a backoff, when a row failed transiently.
func (r *Relayer) laneReport(c *claimed, res BatchResult, errs []error, holds []Hold) (BatchResult, bool, error) {
	_, _, failed, firstTransient := r.settle(c.msgs, errs, time.Now(), &res)
	for _, i := range failed {
		r.obs.PublishFailure(PublishFailure{Message: c.msgs[i], Err: errs[i], Refused: c.refused[c.msgs[i].ID]})
	}
	res.Holds = holds
	r.logHolds(holds)
	r.report(c, res)
	if firstTransient != nil {
		return res, false, fmt.Errorf("publish: %d of %d rows not committed: %w", res.Transient, len(c.msgs), firstTransient)
	}
	return res, c.locked >= c.size, nil
}

// laneClaim opens the claim's transaction, renews the lane's lease in it
// (failing with errLaneLost when the lane moved on) and claims a batch.
func (r *Relayer) laneClaim(ctx context.Context, ln *lane, size int) (*claimed, error) {
	start := time.Now()
	conn, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	tx := &claimTx{conn: conn}
	b := &pgx.Batch{}
	for _, q := range r.begin {
		b.Queue(q)
	}
	b.Queue(r.lanes.timeout, strconv.FormatInt(r.cfg.LaneLease.Milliseconds(), 10))
	b.Queue(r.lanes.renew, ln.n, ln.epoch, r.cfg.LaneLease.Microseconds())
	b.Queue(r.lanes.claim, size, []int64{}, r.cfg.MaxBatchBytes, ln.n)
	br := conn.SendBatch(ctx, b)
	msgs, bad, locked, err := r.readLaneClaim(ctx, br)
	if err != nil {
		tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // reporting the claim's error
		return nil, err
	}
	return &claimed{tx: tx, msgs: msgs, bad: bad, size: size, locked: locked, start: start}, nil
}

func (r *Relayer) readLaneClaim(ctx context.Context, br pgx.BatchResults) ([]Message, map[int64]error, int, error) {
	defer br.Close()
	for range len(r.begin) + 1 {
		if _, err := br.Exec(); err != nil {
			return nil, nil, 0, fmt.Errorf("begin: %w", err)
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("renew the lane: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil, nil, 0, fmt.Errorf("renew the lane: %w", errLaneLost)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("claim: %w", err)
	}
	msgs, bad, locked, err := r.claim(rows)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("claim: %w", cerr)
	}
	if err == nil {
		err = ctx.Err()
	}
	return msgs, bad, locked, err
}

// laneReserve settles, in the claim's transaction, the rows that cannot
// be sent (returned to pending, their failures held), records the others
// as the lane's reservation and commits. A failed COMMIT may have
// committed: the lane is recovered (errOutcomeUnknown).
func (r *Relayer) laneReserve(ctx context.Context, ln *lane, c *claimed) (errs []error, send []Message, sendIdx []int, holds []Hold, seq int64, err error) {
	defer c.tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	errs, send, sendIdx = r.presend(c)
	var scratch BatchResult
	unmark, holds, _, _ := r.settle(c.msgs, errs, time.Now(), &scratch)
	if len(unmark) > 0 {
		if _, err := c.tx.Exec(ctx, r.unmarkSQL, unmark); err != nil {
			return nil, nil, nil, nil, 0, fmt.Errorf("return %d unsendable rows to pending: %w", len(unmark), err)
		}
	}
	if len(holds) > 0 {
		if holds, err = r.recordHolds(ctx, c.tx, holds); err != nil {
			return nil, nil, nil, nil, 0, err
		}
	}
	if len(send) > 0 {
		ids := make([]int64, len(send))
		seen := map[uuid.UUID]bool{}
		var aggs []uuid.UUID
		for i, m := range send {
			ids[i] = m.ID
			if !seen[m.AggregateID] {
				seen[m.AggregateID] = true
				aggs = append(aggs, m.AggregateID)
			}
		}
		if err := c.tx.conn.QueryRow(ctx, r.lanes.reserve, ln.n, ln.epoch, ids, aggs).Scan(&seq); err != nil {
			return nil, nil, nil, nil, 0, fmt.Errorf("reserve %d rows in lane %d: %w", len(ids), ln.n, err)
		}
	}
	if err := c.tx.Commit(ctx); err != nil {
		return nil, nil, nil, nil, 0, fmt.Errorf("commit the claim of %d rows: %w: %w", len(c.msgs), errOutcomeUnknown, err)
	}
	return errs, send, sendIdx, holds, seq, nil
}

// laneAborted settles a reservation whose broker transaction was
// aborted: its rows return to pending and those that caused the abort are
// held, in one transaction that first checks that the lane is still this
// relayer's (else whoever took it settles the reservation).
func (r *Relayer) laneAborted(ctx context.Context, ln *lane, send []Message, perrs []error) ([]error, []Hold, error) {
	// Nothing of the transaction is visible. When some rows caused it
	// (permanent errors), the others merely rode along: deferred, claimed
	// again at once, no backoff; otherwise (a timeout, a coordinator
	// error) every row failed transiently, and the relayer backs off.
	culprit := false
	for _, err := range perrs {
		culprit = culprit || IsPermanent(err)
	}
	errs := make([]error, len(send))
	for i := range send {
		switch {
		case i < len(perrs) && IsPermanent(perrs[i]):
			errs[i] = perrs[i]
		case culprit:
			errs[i] = errDeferred
		case i < len(perrs) && perrs[i] != nil:
			errs[i] = perrs[i]
		default:
			errs[i] = ErrAborted
		}
	}
	var scratch BatchResult
	unmark, holds, _, _ := r.settle(send, errs, time.Now(), &scratch)
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("settle an aborted batch: %w: %w", errOutcomeUnknown, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	tag, err := tx.Exec(ctx, r.lanes.renew, ln.n, ln.epoch, r.cfg.LaneLease.Microseconds())
	if err == nil && tag.RowsAffected() == 0 {
		err = errLaneLost
	}
	if err == nil {
		_, err = tx.Exec(ctx, r.unmarkSQL, unmark)
	}
	if err == nil && len(holds) > 0 {
		holds, err = r.recordHolds(ctx, tx, holds)
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		if errors.Is(err, errLaneLost) {
			return nil, nil, fmt.Errorf("settle an aborted batch: %w", err)
		}
		return nil, nil, fmt.Errorf("settle an aborted batch: %w: %w", errOutcomeUnknown, err)
	}
	return errs, holds, nil
}

// orphanLaneInterval is how often a relayer without ExactlyOnce looks for
// reservations that exactly-once relayers left behind.
const orphanLaneInterval = time.Minute

// watchOrphanLanes starts, on wg, what a relayer without ExactlyOnce
// runs beside its loop until ctx ends or stop is called. Exactly-once
// relayers mark a batch's rows dispatched before they publish it, and
// only their lane's next holder can tell whether it reached the broker;
// with the outbox's relays switched off exactly-once after one of them
// died, no one would, and the rows would stay dispatched, unpublished. So
// this relayer, at start and every orphanLaneInterval, returns the rows
// of any reservation whose lease ran out to pending (a batch that did
// reach the broker is then sent again, which at-least-once allows). At
// start it also warns about exactly-once relayers at work on the same
// outbox: the two kinds do not see each other's batches in flight, and a
// later event of an aggregate can overtake an earlier one.
func (r *Relayer) watchOrphanLanes(ctx context.Context, wg *sync.WaitGroup) (stop func()) {
	ctx, stop = context.WithCancel(ctx)
	wg.Go(func() {
		r.warnLiveLanes(ctx)
		for {
			r.returnOrphanLanes(ctx)
			select {
			case <-ctx.Done():
				return
			case <-time.After(orphanLaneInterval):
			}
		}
	})
	return stop
}

func (r *Relayer) warnLiveLanes(ctx context.Context) {
	rows, err := r.cfg.Pool.Query(ctx, r.lanes.live)
	if err != nil {
		return // the next claim reports a database that is down
	}
	owners, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var lane int
		var owner string
		err := row.Scan(&lane, &owner)
		return fmt.Sprintf("lane %d: %s", lane, owner), err
	})
	if err == nil && len(owners) > 0 {
		r.log.Warn("relay without exactly-once started while relayers with it hold lanes of this outbox: the two kinds do not see each other's batches in flight, so a later event of an aggregate can overtake an earlier one; run every replica with the same setting", "lanes", owners)
	}
}

// orphanLane is a lane whose expired reservation a relayer without
// ExactlyOnce cleared, and the rows it returned to pending.
type orphanLane struct {
	lane     int
	ids      []int64
	returned int64
}

// returnOrphanLanes returns the rows of expired reservations to pending,
// in one transaction, and logs what it returned.
func (r *Relayer) returnOrphanLanes(ctx context.Context) {
	var orphans []orphanLane
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, r.lanes.orphans)
		if err != nil {
			return err
		}
		orphans, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (orphanLane, error) {
			var o orphanLane
			return o, row.Scan(&o.lane, &o.ids)
		})
		if err != nil {
			return err
		}
		for i := range orphans {
			tag, err := tx.Exec(ctx, r.lanes.ret, orphans[i].ids)
			if err != nil {
				return err
			}
			orphans[i].returned = tag.RowsAffected()
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("relay could not check for reservations exactly-once relayers left; it tries again", "err", err, "retry_in", orphanLaneInterval)
		}
		return
	}
	for _, o := range orphans {
		r.log.Warn("relay returned to pending the rows an exactly-once relayer left reserved (its lease ran out): they are sent again, and any it had published arrive twice", "lane", o.lane, "rows", len(o.ids), "returned_to_pending", o.returned)
	}
}
