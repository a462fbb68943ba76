package walrelay

import (
	"context"
	"fmt"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
)

// mark is a commit (or a heartbeat) in the stream: once the first n items
// queued before it are acknowledged, lsn can be acknowledged to the slot.
type mark struct {
	n         int
	lsn       pglogrepl.LSN
	committed time.Time
	// timed is set once a commit's time was recorded in pending for it.
	timed bool
}

// statusGap is the least time between two status updates that tell the
// server of a newly acknowledged position (Config.StatusInterval).
const statusGap = 100 * time.Millisecond

// statusWriteTimeout bounds the write of a status update: a server that
// takes none for that long has stopped reading the stream.
const statusWriteTimeout = 10 * time.Second

// While the stream is behind (the transaction being read committed more
// than behindAge ago), a batch waits up to lingerMax for more events
// before it goes out, instead of leaving with whatever was read: when
// the walsender feeds events slowly (a backlog on a busy server), batches
// of a few events spend the relayer's CPU per batch, which the walsender
// needs. Latency does not suffer: the events are behindAge late already.
// A relayer whose clock runs ahead of the server's by more than
// behindAge lingers always, adding up to lingerMax.
const (
	behindAge = 100 * time.Millisecond
	lingerMax = 20 * time.Millisecond
)

// lingering reports whether the queue waits for more before it goes out.
func (st *streamer) lingering(now time.Time) bool {
	return len(st.queue) > 0 && len(st.queue) < st.r.cfg.BatchSize && st.bytes < st.r.cfg.MaxBatchBytes &&
		!st.commit.IsZero() && now.Sub(st.commit) > behindAge && now.Sub(st.queuedAt) < lingerMax
}

// batch is what the publisher goroutine publishes; end is the position to
// acknowledge once it is settled (0: none, the batch ends inside a
// transaction).
type batch struct {
	items []item
	end   pglogrepl.LSN
	// ok is set once every item was acknowledged or parked; a batch
	// stopped before (shutdown) acknowledges nothing, nor does anything
	// after it.
	ok bool
	// With ExactlyOnce: progress is the position of the last item, err
	// why the batch was not settled (it ends the stream).
	progress []byte
	err      error
}

// streamState is the stream's bookkeeping: what was read and is not yet
// acknowledged. The stream goroutine owns it.
type streamState struct {
	rels   map[uint32]*relation
	inTx   bool
	commit time.Time // the open transaction's commit time
	// queuedAt is when the queue last went from empty to not.
	queuedAt time.Time
	queue    []item
	bytes    int    // of the queue's items (item.size)
	marks    []mark // in stream order; n relative to queue
	acked    pglogrepl.LSN
	pending  []mark      // handed off or queued commits not yet acknowledged, for Lag
	lc       *lingerConn // the connection, when it lingers
}

// streamer is one lead's stream, a small state machine run by stream:
// connect (the replication connection, START_REPLICATION), then steps,
// each doing what is due (a settled batch acknowledged, a batch taken and
// handed to the publisher, a status update) and one read round (decode,
// enqueue), until the stream ends; then finish. The stream goroutine owns
// its fields, but for the round's (roundMu) and done, which the publisher
// goroutine and ctx's end (wake) touch. The publisher goroutine runs
// settle, a method of the Relayer: it touches none of the stream's state.
type streamer struct {
	r *Relayer
	// ctx ends the stream; runCtx is Run's (see stream).
	ctx, runCtx context.Context
	conn        *pgconn.PgConn
	netConn     net.Conn
	// What has been read and not yet acknowledged.
	streamState

	// The batch out: at most one, handed on out to the publisher
	// goroutine, which publishes it under pubCtx and sends it on done once
	// settled. The goroutine lives as long as the stream: one started per
	// batch cost a goroutine's start and the growth of its stack to
	// franz-go's depth for every batch, most of them an event or two at a
	// steady trickle.
	out      chan batch
	done     chan batch
	inflight bool
	wg       sync.WaitGroup
	// The batch out outlives ctx when Run is stopping (as the polling
	// relay's batchContext): it finishes, is acknowledged, then Run
	// returns; ShutdownTimeout after the stop it is cut short.
	pubCtx    context.Context
	stopPub   context.CancelFunc
	stopGrace func() bool

	// The stream is read in rounds, each ending at a deadline on the
	// connection (not a context per read, which costs allocations and a
	// goroutine per message): when a status update falls due or a
	// lingering batch must go out. A settled batch, or ctx's end, ends
	// the round at once (wake).
	roundMu    sync.Mutex
	roundArmed bool // the connection's read deadline is roundEnd
	roundEnd   time.Time
	closing    bool // the stream is over: wake no more

	lastStatus time.Time
	sentAcked  pglogrepl.LSN // the position the last status update told

	// ls is the lane with ExactlyOnce, else nil.
	ls *laneState
}

// stream reads the slot from its confirmed position and publishes in
// commit order until ctx ends or the stream fails. When runCtx (Run's) has
// ended, the batch in flight is let finish within ShutdownTimeout and is
// acknowledged; otherwise (the lock was lost, the stream failed) it is
// stopped at once.
//
// ls is the lead's lane with ExactlyOnce (nil: at least once): each batch
// is published in one of its transactions, and events it holds already
// are skipped.
func (r *Relayer) stream(ctx, runCtx context.Context, start pglogrepl.LSN, ls *laneState) error {
	st := &streamer{r: r, ctx: ctx, runCtx: runCtx, out: make(chan batch, 1), done: make(chan batch, 1), ls: ls}
	if err := st.connect(); err != nil {
		return err
	}
	defer st.conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the stream is over either way
	st.lead(start)
	st.wg.Go(st.publisher)
	defer st.stopPublishing()
	defer context.AfterFunc(ctx, st.wake)()
	defer st.finish()
	for {
		if err := st.step(); err != nil {
			return err
		}
	}
}

// connect opens the replication connection (its socket a lingerConn when
// Linger is set) and starts replication from the slot.
func (st *streamer) connect() error {
	r, ctx := st.r, st.ctx
	pc := r.cfg.Pool.Config().ConnConfig.Config.Copy()
	// A cancelled operation (a status update, the read to a commit at
	// shutdown) must not send the walsender a cancel request: a deadline
	// on the socket ends it and leaves the stream as it is. The stream's
	// own reads use deadlines directly (the rounds).
	pc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	// lc is the stream's own connection: the last one dialled while
	// connecting (pgconn tries the hosts in turn), not one dialled later
	// (a cancel request, were there any).
	var (
		lc        *lingerConn
		connected atomic.Bool
	)
	if r.cfg.Linger > 0 {
		dial := pc.DialFunc
		pc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			l := newLingerConn(c, r.cfg.Linger)
			if !connected.Load() {
				lc = l
			}
			return l, nil
		}
	}
	maps.Copy(pc.RuntimeParams, keepaliveParams)
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = r.appName("stream")
	pc.RuntimeParams["TimeZone"] = "UTC"
	pc.RuntimeParams["DateStyle"] = "ISO"
	pc.RuntimeParams["bytea_output"] = "hex" // binary payloads (decode.go)
	conn, err := pgconn.ConnectConfig(ctx, pc)
	connected.Store(true)
	if err != nil {
		return fmt.Errorf("open the replication connection (the role needs the REPLICATION attribute): %w", err)
	}
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Publication + "'", "messages 'true'"},
	})
	if err != nil {
		err = r.classify(ctx, fmt.Errorf("start replication from slot %s: %w", r.cfg.Slot, err))
		conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // reporting the start's error
		return err
	}
	st.conn, st.netConn, st.lc = conn, conn.Conn(), lc
	return nil
}

// lead sets up the stream of the connection, which replicates from start,
// and tells that this relayer leads.
func (st *streamer) lead(start pglogrepl.LSN) {
	r, ctx, runCtx := st.r, st.ctx, st.runCtx
	st.rels = map[uint32]*relation{}
	st.acked = start
	r.acked.Store(uint64(start))
	r.leading.Store(true)
	r.log.Info("wal relay leads: streaming the slot", "from", start.String())
	st.pubCtx, st.stopPub = context.WithCancel(context.WithoutCancel(ctx))
	st.stopGrace = context.AfterFunc(ctx, func() {
		if runCtx.Err() == nil {
			st.stopPub()
			return
		}
		t := time.AfterFunc(r.cfg.ShutdownTimeout, st.stopPub)
		context.AfterFunc(st.pubCtx, func() { t.Stop() })
	})
}

// stopPublishing releases what newStreamer set up for the batch out.
func (st *streamer) stopPublishing() {
	st.stopGrace()
	st.stopPub()
}

// wake ends the round under way at once.
func (st *streamer) wake() {
	st.roundMu.Lock()
	if !st.closing {
		st.roundArmed = false
		_ = st.netConn.SetReadDeadline(time.Unix(1, 0))
	}
	st.roundMu.Unlock()
}

// step is one turn of the stream: what is due, then one read round (or,
// while the read-ahead is full, a wait for the batch out).
func (st *streamer) step() error {
	// A settled batch moves the acknowledged position.
	select {
	case b := <-st.done:
		if !b.ok {
			if b.err != nil {
				return b.err
			}
			return fmt.Errorf("publishing stopped: %w", context.Cause(st.pubCtx))
		}
		st.inflight = false
		st.advance(b.end)
	default:
	}
	if !st.inflight {
		// Nothing out: a commit or heartbeat with nothing queued before
		// it is acknowledged at once.
		st.advanceIdle()
		if len(st.queue) > 0 && !st.lingering(time.Now()) && !st.unread() {
			st.send(st.take(st.r.cfg.BatchSize, st.r.cfg.MaxBatchBytes))
		}
	}
	if !time.Now().Before(st.nextStatus()) {
		if err := st.sendStatus(statusWriteTimeout); err != nil {
			return err
		}
	}
	if st.inflight && (len(st.queue) >= st.r.cfg.BatchSize || st.bytes >= st.r.cfg.MaxBatchBytes) {
		return st.waitForRoom()
	}
	return st.readRound()
}

// A batch of at most inlineMax events is published on the stream
// goroutine, for up to inlineBound: at a trickle (an event or two a
// batch) handing it to the publisher goroutine, and its settling back,
// cost two goroutine wake-ups a batch, as much CPU as the publish. What
// is not acknowledged within the bound (a slow or unreachable broker, a
// record refused) goes to the publisher goroutine, which retries it in
// order as settle does, while the stream goes back to answering the
// server. A larger batch goes there at once: while it is published the
// stream reads ahead.
const (
	inlineMax   = 32
	inlineBound = time.Second
)

// send publishes b: on the stream goroutine when it is small (inlineMax),
// else, or for what that left unsettled, on the publisher goroutine.
//
// With ExactlyOnce every batch goes to the publisher goroutine: a
// transaction costs three round trips to the broker (AddPartitionsToTxn,
// Produce, EndTxn), beside which the two wake-ups are nothing, and a
// commit cut short by inlineBound would leave its outcome unknown, to be
// learnt by reopening the lane.
func (st *streamer) send(b batch) {
	if len(b.items) > inlineMax || st.ls != nil {
		st.publish(b)
		return
	}
	if rest := st.r.settleInline(st.pubCtx, b.items); len(rest) > 0 {
		b.items = rest
		st.publish(b)
		return
	}
	st.advance(b.end)
}

// unread reports whether a small queue should wait for the rest of what
// the last read took in from the socket (one read takes in several
// transactions, --linger): published on the stream goroutine, the queue
// would otherwise go out an event at a time, each paying a publish.
func (st *streamer) unread() bool {
	return len(st.queue) <= inlineMax && st.conn.Frontend().ReadBufferLen() > 0
}

// publish hands b to the publisher goroutine.
func (st *streamer) publish(b batch) {
	st.inflight = true
	st.out <- b
}

// publisher settles each batch handed to it (settle), sends it on done
// and wakes the stream, until out is closed (finish).
func (st *streamer) publisher() {
	for b := range st.out {
		if st.ls != nil {
			b.err = st.r.settleLane(st.pubCtx, st.runCtx, st.ls, b.items, b.progress)
			b.ok = b.err == nil
			st.done <- b
			st.wake()
			continue
		}
		b.ok = st.r.settle(st.pubCtx, st.runCtx, b.items)
		st.done <- b
		st.wake()
	}
}

// waitForRoom is back pressure: the read-ahead is full, so the stream
// reads on once the batch out is settled, telling the server meanwhile
// that we are alive.
func (st *streamer) waitForRoom() error {
	t := time.NewTimer(time.Until(st.nextStatus()))
	defer t.Stop()
	select {
	case <-st.ctx.Done():
		return st.ctx.Err()
	case b := <-st.done:
		st.done <- b // handled by the next step
	case <-t.C:
	}
	return nil
}

// readRound reads one message of the stream, or ends at the round's
// deadline (nil: the next step sees what is due).
func (st *streamer) readRound() error {
	rearm := st.armRound()
	// A wake before the new deadline was set is seen here: its batch is
	// in done, or ctx has ended.
	if st.ctx.Err() != nil {
		return st.ctx.Err()
	}
	if rearm && len(st.done) > 0 {
		return nil
	}
	raw, err := st.conn.ReceiveMessage(context.Background())
	if err != nil {
		if st.ctx.Err() != nil {
			return st.ctx.Err()
		}
		if pgconn.Timeout(err) {
			return nil // the round's deadline, or a settled batch woke us
		}
		return st.r.classify(st.ctx, fmt.Errorf("receive from slot %s: %w", st.r.cfg.Slot, err))
	}
	return st.handle(raw)
}

// armRound sets the round's deadline: the next status update, or sooner
// when a lingering batch must go out. A round whose deadline is still
// ahead is kept unless the new one is sooner (a commit or heartbeat with
// nothing queued moved the acknowledged position). It reports whether it
// set a new deadline.
func (st *streamer) armRound() bool {
	want := st.nextStatus()
	if l := st.queuedAt.Add(lingerMax); !st.inflight && st.lingering(time.Now()) && l.Before(want) {
		want = l
	}
	st.roundMu.Lock()
	defer st.roundMu.Unlock()
	rearm := !st.roundArmed || !time.Now().Before(st.roundEnd) || want.Before(st.roundEnd)
	if rearm {
		st.roundEnd, st.roundArmed = want, true
		_ = st.netConn.SetReadDeadline(st.roundEnd)
	}
	return rearm
}

// handle applies one message of the replication stream.
func (st *streamer) handle(raw pgproto3.BackendMessage) error {
	switch msg := raw.(type) {
	case *pgproto3.ErrorResponse:
		return st.r.classify(st.ctx, fmt.Errorf("slot %s: %w", st.r.cfg.Slot, pgconn.ErrorResponseToPgError(msg)))
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return nil
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return fmt.Errorf("parse keepalive: %w", err)
			}
			return st.keepalive(ka)
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return fmt.Errorf("parse XLogData: %w", err)
			}
			return st.decodeData(xld)
		}
	}
	return nil
}

// decodeData decodes one message of the stream; with ExactlyOnce it
// notes first where a transaction that begins commits (laneState.beginTx),
// for its events' positions.
func (st *streamer) decodeData(xld pglogrepl.XLogData) error {
	if st.ls != nil {
		st.ls.beginTx(xld.WALData)
	}
	return st.decode(xld)
}

// keepalive applies the server's keepalive.
func (st *streamer) keepalive(ka pglogrepl.PrimaryKeepaliveMessage) error {
	// The server has sent everything before its WAL end: with nothing of
	// ours open or unacknowledged, that position is acknowledged (as
	// pg_recvlogical does).
	if st.r.keepaliveAdvance && !st.inTx {
		st.checkpoint(ka.ServerWALEnd, time.Time{})
	}
	if !ka.ReplyRequested {
		return nil
	}
	if !st.inflight {
		st.advanceIdle()
	}
	return st.sendStatus(statusWriteTimeout)
}

// sendStatus tells the server the position the broker acknowledged.
// pglogrepl's send takes no context: a deadline bounds the write.
func (st *streamer) sendStatus(timeout time.Duration) error {
	st.lastStatus = time.Now()
	st.sentAcked = st.acked
	_ = st.netConn.SetWriteDeadline(time.Now().Add(timeout))
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), st.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: st.acked, WALFlushPosition: st.acked, WALApplyPosition: st.acked,
	})
	_ = st.netConn.SetWriteDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	return nil
}

// nextStatus is when the next status update is due: StatusInterval after
// the last, or statusGap after it once the broker acknowledged more than
// the server was told, so that the slot follows the broker within about
// statusGap of a batch (and its lag drops to ~0 that soon after a load
// stops), without an update per small batch.
func (st *streamer) nextStatus() time.Time {
	if st.acked > st.sentAcked {
		return st.lastStatus.Add(min(statusGap, st.r.cfg.StatusInterval))
	}
	return st.lastStatus.Add(st.r.cfg.StatusInterval)
}

// finish ends the stream: the batch out is stopped (or, when Run is
// stopping, let finish), and what the broker acknowledged is told to the
// server, so that a restart re-sends as little as it can.
func (st *streamer) finish() {
	// Reads from here on (readToCommit) have their own deadlines.
	st.roundMu.Lock()
	st.closing = true
	_ = st.netConn.SetReadDeadline(time.Time{})
	st.roundMu.Unlock()
	if st.runCtx.Err() == nil {
		st.stopPub()
	} else if st.inflight {
		st.r.log.Info("wal relay stopping: letting the batch out finish", "shutdown_timeout", st.r.cfg.ShutdownTimeout)
	}
	close(st.out)
	st.wg.Wait()
	select {
	case b := <-st.done:
		if b.ok {
			st.advance(b.end)
			st.inflight = false
		}
	default:
	}
	if !st.inflight {
		st.advanceIdle()
		if st.runCtx.Err() != nil && st.inTx && len(st.queue) == 0 {
			st.readToCommit()
		}
	}
	_ = st.sendStatus(5 * time.Second) // best effort: the slot keeps the last one otherwise
}

// readToCommit is for a graceful stop whose last batch ended inside a
// transaction (a batch is handed off as soon as an event is read, before
// its commit): everything read of that transaction went out, so reading
// on to its commit, if nothing else of it comes first, lets that commit
// be acknowledged rather than the transaction re-sent by the next leader.
// Bounded, best effort.
func (st *streamer) readToCommit() {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), min(st.r.cfg.ShutdownTimeout, 5*time.Second))
	defer cancel()
	for st.inTx && len(st.queue) == 0 {
		raw, err := st.conn.ReceiveMessage(rctx)
		if err != nil {
			return
		}
		msg, ok := raw.(*pgproto3.CopyData)
		if !ok || len(msg.Data) == 0 || msg.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
		if err != nil || st.decodeData(xld) != nil {
			return
		}
	}
	st.advanceIdle()
}

// advanceIdle acknowledges the commits and heartbeats at the queue's
// head, which have nothing queued before them.
func (st *streamer) advanceIdle() {
	for len(st.marks) > 0 && st.marks[0].n == 0 {
		st.advance(st.marks[0].lsn)
		st.marks = st.marks[1:]
	}
}

// take hands the first queued items, at most n and maxBytes (but at least
// one), to the publisher, with the position of the last commit among them.
func (st *streamer) take(n, maxBytes int) batch {
	n = min(n, len(st.queue))
	size := st.queue[0].size()
	for i := 1; i < n; i++ {
		if size+st.queue[i].size() > maxBytes {
			n = i
			break
		}
		size += st.queue[i].size()
	}
	st.bytes -= size
	b := batch{items: st.queue[:n:n]}
	st.queue = st.queue[n:]
	if st.ls != nil {
		b.progress = st.ls.pos[n-1].progress()
		st.ls.pos = st.ls.pos[n:]
	}
	k := 0
	for k < len(st.marks) && st.marks[k].n <= n {
		b.end = st.marks[k].lsn
		k++
	}
	st.marks = st.marks[k:]
	for i := range st.marks {
		st.marks[i].n -= n
	}
	if len(st.queue) == 0 {
		st.queue = nil
		st.bytes = 0
	}
	return b
}

// enqueue queues it for the publisher; with ExactlyOnce, unless the
// lane holds it already.
func (st *streamer) enqueue(it item) {
	if st.ls != nil && !st.ls.admit(st.r, it.msg.ID) {
		return
	}
	if len(st.queue) == 0 {
		st.queuedAt = time.Now()
	}
	st.queue = append(st.queue, it)
	st.bytes += it.size()
	if int64(st.bytes) > st.r.queuedBytesMax.Load() {
		st.r.queuedBytesMax.Store(int64(st.bytes))
	}
}

// checkpoint records a position that can be acknowledged once everything
// queued so far is: a commit, a heartbeat, a keepalive's WAL end.
func (st *streamer) checkpoint(lsn pglogrepl.LSN, committed time.Time) {
	if lsn <= st.acked {
		return
	}
	// pending gets one entry per mark, the oldest commit's, not one per
	// transaction: while a batch retries, transactions that queue nothing
	// (other tables', heartbeats) must not grow it.
	if k := len(st.marks); k > 0 && st.marks[k-1].n == len(st.queue) {
		m := &st.marks[k-1]
		m.lsn = max(m.lsn, lsn)
		if !committed.IsZero() && !m.timed {
			m.timed = true
			st.pending = append(st.pending, mark{lsn: lsn, committed: committed})
		}
		return
	}
	st.marks = append(st.marks, mark{n: len(st.queue), lsn: lsn, timed: !committed.IsZero()})
	if !committed.IsZero() {
		st.pending = append(st.pending, mark{lsn: lsn, committed: committed})
	}
}

// advance acknowledges lsn (the broker has everything before it).
func (st *streamer) advance(lsn pglogrepl.LSN) {
	if lsn > st.acked {
		st.acked = lsn
		st.r.acked.Store(uint64(lsn))
		st.r.progress.Add(1)
	}
	k := 0
	for k < len(st.pending) && st.pending[k].lsn <= st.acked {
		k++
	}
	st.pending = st.pending[k:]
	if len(st.pending) == 0 {
		st.r.oldestUnacked.Store(0)
	} else {
		st.r.oldestUnacked.Store(st.pending[0].committed.UnixNano())
	}
}

// classify turns a stream failure into ErrSlotLost when the slot was
// invalidated meanwhile.
func (r *Relayer) classify(ctx context.Context, err error) error {
	var status string
	// Bounded: during a partition this must not hold up the stream's exit.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if qerr := r.cfg.Pool.QueryRow(qctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&status); qerr == nil && status == "lost" {
		return fmt.Errorf("%w: slot %s has wal_status=lost (it fell behind max_slot_wal_keep_size): drop it (outbox relay --mode wal --teardown), republish the gap from the table (outbox relay --mode poll) and start again; %v", ErrSlotLost, r.cfg.Slot, err)
	}
	return err
}
