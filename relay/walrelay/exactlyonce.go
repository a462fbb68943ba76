package walrelay

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/relay"
)

// With Common.ExactlyOnce the leader publishes each batch in one broker
// transaction of its slot's lane (relay.Lane, id LaneID("wal/<slot>")),
// which also records the position of the batch's last event. The slot is
// confirmed only past what such transactions (or the parked table) hold,
// as at least once; but the slot's position can be behind them: a relayer
// killed between the commit and the slot's confirmation, or a Postgres
// crash, which takes the slot back to its last checkpoint. So a new lead
// opens the lane (fencing the previous leader's), reads the progress the
// last committed transaction recorded, and skips every event read again
// at or before it.

// position is an event's place in the stream: the commit LSN of its
// transaction, then its ordinal among the transaction's events as the
// decoder delivers them (1 for the first). Transactions are decoded in
// commit order and a transaction's changes always in the same order, so
// positions grow along the stream and an event read again after a
// restart, from any earlier slot position, has the same one. The ordinal
// rather than the event id orders events within a transaction: ids follow
// the insert order for Emit and <outbox>_emit_message, but not for every
// writer (an unpark or replay re-inserts old ids, in any order). ID is
// kept for the logs and a check.
type position struct {
	LSN pglogrepl.LSN
	N   int64
	ID  int64
}

// after reports whether p comes after q in the stream.
func (p position) after(q position) bool {
	return p.LSN > q.LSN || p.LSN == q.LSN && p.N > q.N
}

// progressJSON is a position as a lane records it.
type progressJSON struct {
	LSN string `json:"lsn"`
	N   int64  `json:"n"`
	ID  int64  `json:"id"`
}

func (p position) progress() []byte {
	b, _ := json.Marshal(progressJSON{LSN: p.LSN.String(), N: p.N, ID: p.ID})
	return b
}

// parseProgress reads a lane's progress; nil is the stream's start.
func parseProgress(b []byte) (position, error) {
	if b == nil {
		return position{}, nil
	}
	var pj progressJSON
	if err := json.Unmarshal(b, &pj); err != nil {
		return position{}, fmt.Errorf("walrelay: the lane's progress %q is not a WAL position (%w): is another outbox's relay using the same transactional id? Give each outbox its own (TransactionalID, --transactional-id)", b, err)
	}
	lsn, err := pglogrepl.ParseLSN(pj.LSN)
	if err != nil || pj.N < 1 {
		return position{}, fmt.Errorf("walrelay: the lane's progress %q is not a WAL position: is another outbox's relay using the same transactional id? Give each outbox its own (TransactionalID, --transactional-id)", b)
	}
	return position{LSN: lsn, N: pj.N, ID: pj.ID}, nil
}

// laneState is one lead's lane and its place in the stream. The stream
// goroutine owns the positions; the lane is used by the publisher
// goroutine only (streamer.send hands every batch to it).
type laneState struct {
	lane relay.Lane
	id   string
	// committed is the progress read when the lane was opened: events up
	// to it are skipped.
	committed position
	// tx is the commit LSN of the transaction being read, n the ordinal
	// of its last event.
	tx      pglogrepl.LSN
	n       int64
	skipped int64
	// reported is set once skipped went to the hooks (relay.LaneSkipped).
	reported bool
	// pos holds the positions of the stream's queue, item for item.
	pos []position
}

// errLaneUnknown wraps a lane error after which the outcome of the last
// transaction is unknown: the lead reopens the lane to learn it.
var errLaneUnknown = errors.New("the lane's last transaction has an unknown outcome")

// beginTx notes the commit LSN of the transaction a Begin message (its
// WAL data, pgoutput's 'B', then the final LSN) starts.
func (ls *laneState) beginTx(data []byte) {
	if len(data) >= 9 && data[0] == 'B' {
		ls.tx = pglogrepl.LSN(binary.BigEndian.Uint64(data[1:9]))
		ls.n = 0
	}
}

// admit gives an event read from the stream its position and reports
// whether it is to be published: false for one the lane's progress holds
// already.
func (ls *laneState) admit(r *Relayer, id int64) bool {
	ls.n++
	p := position{LSN: ls.tx, N: ls.n, ID: id}
	if p.after(ls.committed) {
		ls.reportSkipped(r)
		ls.pos = append(ls.pos, p)
		return true
	}
	ls.skipped++
	r.skipped.Add(1)
	if p.LSN == ls.committed.LSN && p.N == ls.committed.N {
		if p.ID != ls.committed.ID {
			r.log.Error("wal relay: the event at the lane's progress has another id than the progress recorded: the progress may come from another stream (another outbox on the same transactional id?)", "lsn", p.LSN.String(), "n", p.N, "id", p.ID, "progress_id", ls.committed.ID)
		}
		ls.reportSkipped(r)
	}
	return false
}

// reportSkipped logs and reports to the hooks, once, the events skipped
// so far: the stream has read up to the lane's progress (or past it, when
// the slot had confirmed beyond its last events).
func (ls *laneState) reportSkipped(r *Relayer) {
	if ls.reported || ls.skipped == 0 {
		return
	}
	ls.reported = true
	r.log.Info("wal relay caught up with the lane's progress: the events read again up to it were skipped", "skipped", ls.skipped)
	r.obs.Lane(relay.LaneEvent{Kind: relay.LaneSkipped, Lane: ls.id, Skipped: ls.skipped})
}

// openLane opens the slot's lane, fencing the previous leader's, and reads
// its progress.
func (r *Relayer) openLane(ctx context.Context) (*laneState, error) {
	ts, err := r.cfg.TransactionalSink()
	if err != nil {
		return nil, err
	}
	id := r.cfg.LaneID("wal/" + r.cfg.Slot)
	lane, progress, err := ts.OpenLane(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("open lane %s: %w", id, err)
	}
	committed, err := parseProgress(progress)
	if err != nil {
		lane.Close()
		return nil, err
	}
	r.obs.Lane(relay.LaneEvent{Kind: relay.LaneOpened, Lane: id})
	r.log.Info("wal relay opened its lane: events up to its progress are published already and are skipped", "lane", id, "progress_lsn", committed.LSN.String(), "progress_n", committed.N, "progress_id", committed.ID)
	return &laneState{lane: lane, id: id, committed: committed}, nil
}

// streamExactlyOnce is the leader's stream with ExactlyOnce: open the
// lane, stream from the slot's confirmed position skipping what the lane
// holds, and, when a transaction's outcome is unknown, close the lane,
// back off and start over (still leading). It returns when ctx ends, on a
// failure that ends the lead, or when another relayer took the lane
// (relay.ErrFenced).
func (r *Relayer) streamExactlyOnce(ctx, runCtx context.Context, db outbox.DB) error {
	failures := 0
	for {
		ls, err := r.openLane(ctx)
		if err == nil {
			var start pglogrepl.LSN
			if start, err = r.checkSlot(ctx, db); err == nil {
				r.log.Info("wal relay streams from the slot's position; events at or before the lane's progress are skipped", "from", start.String(), "progress_lsn", ls.committed.LSN.String())
				err = r.stream(ctx, runCtx, start, ls)
			}
			ls.lane.Close()
			if errors.Is(err, relay.ErrFenced) {
				r.obs.Lane(relay.LaneEvent{Kind: relay.LaneLost, Lane: ls.id, Err: err})
			}
			if err != nil && !errors.Is(err, errLaneUnknown) {
				return err
			}
		} else if errors.Is(err, relay.ErrFenced) || ctx.Err() != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		failures++
		r.failedBatches.Add(1)
		d := backoff.Delay(r.cfg.BackoffMin, r.cfg.BackoffMax, failures)
		r.log.Warn("wal relay: the lane failed; reopening it to learn what it committed, then streaming again", "err", err, "attempt", failures, "retry_in", d.Round(time.Millisecond))
		if !backoff.Sleep(ctx, d) {
			return nil
		}
	}
}

// settleLane publishes items in one transaction of the lane with
// progress, the position of the last: every event is then published or
// parked. A record refused for good aborts the transaction
// (relay.ErrAborted): it is parked, before the next transaction commits
// the rest (a record parked after a commit that recorded it would be
// skipped after a crash, and lost), as is any item that was refused
// before it was sent. A topic the broker does not know is retried for
// UnknownTopicGrace, as settle does. An abort that blames no record
// backs off and tries again. Any other error is returned: the outcome is
// unknown (errLaneUnknown), or the lane lost (relay.ErrFenced).
func (r *Relayer) settleLane(ctx, runCtx context.Context, ls *laneState, items []item, progress []byte) error {
	r.checkContracts(items)
	sleepCtx, stopSleep := context.WithCancel(ctx)
	defer stopSleep()
	defer context.AfterFunc(runCtx, stopSleep)()
	var unknownSince map[int64]time.Time
	for failures := 0; ctx.Err() == nil; {
		var err error
		items, err = r.laneRound(ctx, ls.lane, items, progress, &unknownSince)
		if err == nil {
			r.batches.Add(1)
			return nil
		}
		if !errors.Is(err, relay.ErrAborted) {
			return err
		}
		r.obs.Lane(relay.LaneEvent{Kind: relay.LaneAborted, Lane: ls.id, Err: err})
		if errors.Is(err, errBlamed) {
			continue // the culprits are parked in the next round
		}
		if runCtx.Err() != nil {
			return fmt.Errorf("stopping: %w", err)
		}
		failures++
		r.failedBatches.Add(1)
		r.obs.BatchError(err)
		d := backoff.Delay(r.cfg.BackoffMin, r.cfg.BackoffMax, failures)
		r.log.Warn("wal relay transaction aborted; retrying it", "err", err, "events", len(items), "attempt", failures, "retry_in", d.Round(time.Millisecond))
		if !backoff.Sleep(sleepCtx, d) {
			return fmt.Errorf("stopped: %w", err)
		}
	}
	return context.Cause(ctx)
}

// errBlamed: an abort whose culprits are known and marked for parking.
var errBlamed = errors.New("records refused for good")

// laneRound parks the items refused so far, then publishes the others
// with progress in one transaction. It returns the items still to
// settle: nil once committed; on relay.ErrAborted, those not parked, the
// culprits of the abort marked with their errors (errBlamed).
func (r *Relayer) laneRound(ctx context.Context, lane relay.Lane, items []item, progress []byte, unknownSince *map[int64]time.Time) ([]item, error) {
	start := time.Now()
	var park, keep []item
	for _, it := range items {
		if it.err != nil {
			park = append(park, it)
		} else {
			keep = append(keep, it)
		}
	}
	if len(park) > 0 {
		if rest, err := r.parkOrDrop(ctx, park); err != nil {
			r.observe(start, len(park), nil, nil, park, rest)
			return mergeInOrder(items, keep, rest), fmt.Errorf("%w: park: %w", relay.ErrAborted, err)
		}
		r.observe(start, len(park), nil, nil, park, nil)
		start = time.Now()
	}
	send := make([]relay.Message, len(keep))
	for i := range keep {
		send[i] = keep[i].msg
	}
	errs, err := r.obs.PublishLane(ctx, lane, send, progress)
	if len(errs) != len(send) {
		errs = make([]error, len(send))
	}
	if err != nil && !errors.Is(err, relay.ErrAborted) {
		for i := range errs {
			errs[i] = err
		}
		r.observe(start, len(keep), send, errs, nil, nil)
		if errors.Is(err, relay.ErrFenced) {
			return keep, err
		}
		return keep, fmt.Errorf("%w: %w", errLaneUnknown, err)
	}
	if err == nil {
		r.published.Add(int64(len(send)))
		r.observe(start, len(keep), send, errs, nil, nil)
		return nil, nil
	}
	blamed := false
	for i := range keep {
		e := errs[i]
		if e == nil || !relay.IsPermanent(e) ||
			relay.ReasonOf(e) == relay.ReasonInvalidTopic && r.withinGrace(unknownSince, keep[i].msg.ID) {
			continue
		}
		keep[i].err, blamed = e, true
	}
	// Reported as a failed try; the culprits are parked, and reported
	// so, in the next round.
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
	r.observe(start, len(keep), send, errs, nil, nil)
	if blamed {
		return keep, fmt.Errorf("%w: %w", errBlamed, err)
	}
	return keep, err
}
