package walrelay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/relay"
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
func (r *Relayer) lingering(s *streamState, now time.Time) bool {
	return len(s.queue) > 0 && len(s.queue) < r.cfg.BatchSize && s.bytes < r.cfg.MaxBatchBytes &&
		!s.commit.IsZero() && now.Sub(s.commit) > behindAge && now.Sub(s.queuedAt) < lingerMax
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
}

// streamState is the stream's bookkeeping, owned by the stream goroutine.
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

// stream reads the slot from its confirmed position and publishes in
// commit order until ctx ends or the stream fails. When runCtx (Run's) has
// ended, the batch in flight is let finish within ShutdownTimeout and is
// acknowledged; otherwise (the lock was lost, the stream failed) it is
// stopped at once.
func (r *Relayer) stream(ctx, runCtx context.Context, start pglogrepl.LSN) error {
	pc := r.cfg.Pool.Config().ConnConfig.Config.Copy()
	// A cancelled operation (a status update, the read to a commit at
	// shutdown) must not send the walsender a cancel request: a deadline
	// on the socket ends it and leaves the stream as it is. The stream's
	// own reads use deadlines directly (the rounds below).
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
	conn, err := pgconn.ConnectConfig(ctx, pc)
	connected.Store(true)
	if err != nil {
		return fmt.Errorf("open the replication connection (the role needs the REPLICATION attribute): %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the stream is over either way
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Publication + "'", "messages 'true'"},
	})
	if err != nil {
		return r.classify(ctx, fmt.Errorf("start replication from slot %s: %w", r.cfg.Slot, err))
	}
	s := &streamState{rels: map[uint32]*relation{}, acked: start, lc: lc}
	r.acked.Store(uint64(start))
	r.leading.Store(true)
	r.log.Info("wal relay leads: streaming the slot", "from", start.String())

	done := make(chan batch, 1)
	var (
		inflight bool
		wg       sync.WaitGroup
		// The stream is read in rounds, each ending at a deadline on the
		// connection (not a context per read, which costs allocations
		// and a goroutine per message): when a status update falls due
		// or a lingering batch must go out. A settled batch, or ctx's
		// end, ends the round at once (wake).
		roundMu    sync.Mutex
		roundArmed bool // the connection's read deadline is roundEnd
		roundEnd   time.Time
		closing    bool // the stream is over: wake no more
		lastStatus time.Time
		sentAcked  pglogrepl.LSN // the position the last status update told
	)
	// The batch out outlives ctx when Run is stopping (as the polling
	// relay's batchContext): it finishes, is acknowledged, then Run
	// returns; ShutdownTimeout after the stop it is cut short.
	pubCtx, stopPub := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPub()
	stopGrace := context.AfterFunc(ctx, func() {
		if runCtx.Err() == nil {
			stopPub()
			return
		}
		t := time.AfterFunc(r.cfg.ShutdownTimeout, stopPub)
		context.AfterFunc(pubCtx, func() { t.Stop() })
	})
	defer stopGrace()
	netConn := conn.Conn()
	wake := func() {
		roundMu.Lock()
		if !closing {
			roundArmed = false
			_ = netConn.SetReadDeadline(time.Unix(1, 0))
		}
		roundMu.Unlock()
	}
	defer context.AfterFunc(ctx, wake)()
	// sendStatus tells the server the position the broker acknowledged.
	// pglogrepl's send takes no context: a deadline bounds the write.
	sendStatus := func(timeout time.Duration) error {
		lastStatus = time.Now()
		sentAcked = s.acked
		_ = netConn.SetWriteDeadline(time.Now().Add(timeout))
		err := pglogrepl.SendStandbyStatusUpdate(context.Background(), conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: s.acked, WALFlushPosition: s.acked, WALApplyPosition: s.acked,
		})
		_ = netConn.SetWriteDeadline(time.Time{})
		if err != nil {
			return fmt.Errorf("send standby status: %w", err)
		}
		return nil
	}
	// nextStatus is when the next status update is due: StatusInterval
	// after the last, or statusGap after it once the broker acknowledged
	// more than the server was told, so that the slot follows the broker
	// within about statusGap of a batch (and its lag drops to ~0 that
	// soon after a load stops), without an update per small batch.
	nextStatus := func() time.Time {
		if s.acked > sentAcked {
			return lastStatus.Add(min(statusGap, r.cfg.StatusInterval))
		}
		return lastStatus.Add(r.cfg.StatusInterval)
	}
	// On the way out, the batch out is stopped (or, when Run is stopping,
	// let finish), and what the broker acknowledged is told to the
	// server, so that a restart re-sends as little as it can.
	defer func() {
		// Reads from here on (readToCommit) have their own deadlines.
		roundMu.Lock()
		closing = true
		_ = netConn.SetReadDeadline(time.Time{})
		roundMu.Unlock()
		if runCtx.Err() == nil {
			stopPub()
		} else if inflight {
			r.log.Info("wal relay stopping: letting the batch out finish", "shutdown_timeout", r.cfg.ShutdownTimeout)
		}
		wg.Wait()
		select {
		case b := <-done:
			if b.ok {
				r.advance(s, b.end)
				inflight = false
			}
		default:
		}
		if !inflight {
			for len(s.marks) > 0 && s.marks[0].n == 0 {
				r.advance(s, s.marks[0].lsn)
				s.marks = s.marks[1:]
			}
			if runCtx.Err() != nil && s.inTx && len(s.queue) == 0 {
				r.readToCommit(ctx, conn, s)
			}
		}
		_ = sendStatus(5 * time.Second) // best effort: the slot keeps the last one otherwise
	}()
	for {
		// A settled batch moves the acknowledged position.
		select {
		case b := <-done:
			if !b.ok {
				return fmt.Errorf("publishing stopped: %w", context.Cause(pubCtx))
			}
			inflight = false
			r.advance(s, b.end)
		default:
		}
		if !inflight {
			// Nothing out: a commit or heartbeat with nothing queued
			// before it is acknowledged at once.
			for len(s.marks) > 0 && s.marks[0].n == 0 {
				r.advance(s, s.marks[0].lsn)
				s.marks = s.marks[1:]
			}
			if len(s.queue) > 0 && !r.lingering(s, time.Now()) {
				b := s.take(r.cfg.BatchSize, r.cfg.MaxBatchBytes)
				inflight = true
				wg.Go(func() {
					b.ok = r.settle(pubCtx, runCtx, b.items)
					done <- b
					wake()
				})
			}
		}
		if !time.Now().Before(nextStatus()) {
			if err := sendStatus(statusWriteTimeout); err != nil {
				return err
			}
		}
		if inflight && (len(s.queue) >= r.cfg.BatchSize || s.bytes >= r.cfg.MaxBatchBytes) {
			// Back pressure: read on once the batch out is settled,
			// telling the server meanwhile that we are alive.
			t := time.NewTimer(time.Until(nextStatus()))
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case b := <-done:
				done <- b // handled at the top
			case <-t.C:
			}
			t.Stop()
			continue
		}
		// A new round also when a status update fell due sooner than the
		// round ends (a commit or heartbeat with nothing queued moved the
		// acknowledged position), or a lingering batch must go out sooner.
		want := nextStatus()
		if l := s.queuedAt.Add(lingerMax); !inflight && r.lingering(s, time.Now()) && l.Before(want) {
			want = l
		}
		roundMu.Lock()
		rearm := !roundArmed || !time.Now().Before(roundEnd) || want.Before(roundEnd)
		if rearm {
			roundEnd, roundArmed = want, true
			_ = netConn.SetReadDeadline(roundEnd)
		}
		roundMu.Unlock()
		// A wake before the new deadline was set is seen here: its batch
		// is in done, or ctx has ended.
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if rearm && len(done) > 0 {
			continue
		}
		raw, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue // the round's deadline, or a settled batch woke us
			}
			return r.classify(ctx, fmt.Errorf("receive from slot %s: %w", r.cfg.Slot, err))
		}
		switch msg := raw.(type) {
		case *pgproto3.ErrorResponse:
			return r.classify(ctx, fmt.Errorf("slot %s: %w", r.cfg.Slot, pgconn.ErrorResponseToPgError(msg)))
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse keepalive: %w", err)
				}
				// The server has sent everything before its WAL end: with
				// nothing of ours open or unacknowledged, that position is
				// acknowledged (as pg_recvlogical does).
				if r.keepaliveAdvance && !s.inTx {
					s.checkpoint(ka.ServerWALEnd, time.Time{})
				}
				if ka.ReplyRequested {
					if !inflight {
						for len(s.marks) > 0 && s.marks[0].n == 0 {
							r.advance(s, s.marks[0].lsn)
							s.marks = s.marks[1:]
						}
					}
					if err := sendStatus(statusWriteTimeout); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse XLogData: %w", err)
				}
				if err := r.decode(s, xld); err != nil {
					return err
				}
			}
		}
	}
}

// readToCommit is for a graceful stop whose last batch ended inside a
// transaction (a batch is handed off as soon as an event is read, before
// its commit): everything read of that transaction went out, so reading
// on to its commit, if nothing else of it comes first, lets that commit
// be acknowledged rather than the transaction re-sent by the next leader.
// Bounded, best effort.
func (r *Relayer) readToCommit(ctx context.Context, conn *pgconn.PgConn, s *streamState) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(r.cfg.ShutdownTimeout, 5*time.Second))
	defer cancel()
	for s.inTx && len(s.queue) == 0 {
		raw, err := conn.ReceiveMessage(rctx)
		if err != nil {
			return
		}
		msg, ok := raw.(*pgproto3.CopyData)
		if !ok || len(msg.Data) == 0 || msg.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
		if err != nil || r.decode(s, xld) != nil {
			return
		}
	}
	for len(s.marks) > 0 && s.marks[0].n == 0 {
		r.advance(s, s.marks[0].lsn)
		s.marks = s.marks[1:]
	}
}

// take hands the first queued items, at most n and maxBytes (but at least
// one), to the publisher, with the position of the last commit among them.
func (s *streamState) take(n, maxBytes int) batch {
	n = min(n, len(s.queue))
	size := s.queue[0].size()
	for i := 1; i < n; i++ {
		if size+s.queue[i].size() > maxBytes {
			n = i
			break
		}
		size += s.queue[i].size()
	}
	s.bytes -= size
	b := batch{items: s.queue[:n:n]}
	s.queue = s.queue[n:]
	k := 0
	for k < len(s.marks) && s.marks[k].n <= n {
		b.end = s.marks[k].lsn
		k++
	}
	s.marks = s.marks[k:]
	for i := range s.marks {
		s.marks[i].n -= n
	}
	if len(s.queue) == 0 {
		s.queue = nil
		s.bytes = 0
	}
	return b
}

// enqueue queues it for the publisher.
func (r *Relayer) enqueue(s *streamState, it item) {
	if len(s.queue) == 0 {
		s.queuedAt = time.Now()
	}
	s.queue = append(s.queue, it)
	s.bytes += it.size()
	if int64(s.bytes) > r.queuedBytesMax.Load() {
		r.queuedBytesMax.Store(int64(s.bytes))
	}
}

// checkpoint records a position that can be acknowledged once everything
// queued so far is: a commit, a heartbeat, a keepalive's WAL end.
func (s *streamState) checkpoint(lsn pglogrepl.LSN, committed time.Time) {
	if lsn <= s.acked {
		return
	}
	// pending gets one entry per mark, the oldest commit's, not one per
	// transaction: while a batch retries, transactions that queue nothing
	// (other tables', heartbeats) must not grow it.
	if k := len(s.marks); k > 0 && s.marks[k-1].n == len(s.queue) {
		m := &s.marks[k-1]
		m.lsn = max(m.lsn, lsn)
		if !committed.IsZero() && !m.timed {
			m.timed = true
			s.pending = append(s.pending, mark{lsn: lsn, committed: committed})
		}
		return
	}
	s.marks = append(s.marks, mark{n: len(s.queue), lsn: lsn, timed: !committed.IsZero()})
	if !committed.IsZero() {
		s.pending = append(s.pending, mark{lsn: lsn, committed: committed})
	}
}

// advance acknowledges lsn (the broker has everything before it).
func (r *Relayer) advance(s *streamState, lsn pglogrepl.LSN) {
	if lsn > s.acked {
		s.acked = lsn
		r.acked.Store(uint64(lsn))
		r.progress.Add(1)
	}
	k := 0
	for k < len(s.pending) && s.pending[k].lsn <= s.acked {
		k++
	}
	s.pending = s.pending[k:]
	if len(s.pending) == 0 {
		r.oldestUnacked.Store(0)
	} else {
		r.oldestUnacked.Store(s.pending[0].committed.UnixNano())
	}
}

// decode applies one pgoutput message to the stream's state.
func (r *Relayer) decode(s *streamState, xld pglogrepl.XLogData) error {
	m, err := pglogrepl.Parse(xld.WALData)
	if err != nil {
		return fmt.Errorf("decode pgoutput message at %s: %w", xld.WALStart, err)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		rel, err := newRelation(m, r.cfg.Tables)
		if err != nil {
			return err
		}
		s.rels[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		s.inTx = true
		s.commit = m.CommitTime
		if s.lc != nil {
			// Behind, the walsender is the bottleneck: read it without
			// pause (a backlog of small transactions drained 10-30%
			// slower with a 2 ms linger).
			s.lc.behind.Store(time.Since(m.CommitTime) > behindAge)
		}
	case *pglogrepl.CommitMessage:
		s.inTx = false
		s.checkpoint(m.TransactionEndLSN, m.CommitTime)
		if len(s.pending) == 1 {
			r.oldestUnacked.Store(s.pending[0].committed.UnixNano())
		}
	case *pglogrepl.InsertMessage:
		rel, ok := s.rels[m.RelationID]
		if !ok {
			return fmt.Errorf("walrelay: insert into relation %d before its description", m.RelationID)
		}
		if !rel.outbox {
			return nil
		}
		it, err := rel.insertItem(m.Tuple, r.cfg.TopicPrefix)
		if err != nil {
			return err
		}
		r.enqueue(s, it)
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix == r.prefix {
			// Only a transactional message exists iff its transaction
			// committed (pgoutput sends it with the commit, and never
			// for a rollback); a non-transactional one is written at
			// once, rolled back or not, so it is never an event. And
			// only an outbox in message mode takes events from messages
			// (Config.Messages, which Run lets start only once no role
			// but the producers can write them).
			switch {
			case !m.Transactional:
				r.dropped.Add(1)
				r.log.Error("wal relay dropped a non-transactional logical message with the outbox's prefix: it is no event (it exists whether or not a transaction commits); producers write transactional messages (outbox.ModeMessage)", "lsn", m.LSN.String())
			case !r.cfg.Messages:
				r.dropped.Add(1)
				r.log.Error("wal relay dropped a logical message with the outbox's prefix: message-mode events are off; if this outbox's producers use outbox.ModeMessage, secure pg_logical_emit_message and start the relay with --messages (Config.Messages)", "lsn", m.LSN.String())
			default:
				it, err := messageItem(m.Content, s.commit, r.cfg.TopicPrefix)
				if err != nil {
					r.dropped.Add(1)
					r.log.Error("wal relay dropped a logical message with the outbox's prefix that is not an event", "lsn", m.LSN.String(), "err", err)
				} else {
					r.enqueue(s, it)
				}
			}
			if m.Transactional {
				return nil
			}
		}
		if !m.Transactional {
			// A heartbeat (ours, or any other non-transactional message):
			// everything before it has been sent.
			if m.Prefix == HeartbeatPrefix {
				r.heartbeats.Add(1)
			}
			// m.LSN is the end of the message's record, which is where
			// the next record starts: confirming one byte more would
			// let the slot skip a transaction whose commit record
			// follows the message (a heartbeat from another session
			// lands between a transaction's inserts and its commit).
			if !s.inTx {
				s.checkpoint(m.LSN, time.Time{})
			}
		}
	}
	return nil
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

// settle publishes items until each is acknowledged or parked: a record
// the broker refuses for good (or the relayer cannot decode) is moved to
// the parked table and the stream goes on without it; anything else is
// retried, in order, with backoff, for as long as it takes (or until ctx
// ends). Publish never acknowledges a record of an aggregate ahead of an
// earlier one that failed, so retrying the unacknowledged ones in order
// keeps each aggregate's order, but for the parked.
//
// A topic the broker does not know (ReasonInvalidTopic from the
// publisher; a type that makes no valid topic name is refused before, in
// decode) is retried for UnknownTopicGrace, then parked: the topic may be
// about to be created.
//
// Once runCtx ends (Run is stopping), the publish under way is let
// finish, but a failed one is not retried: the next leader re-sends it.
//
// It reports whether every item was settled.
func (r *Relayer) settle(ctx, runCtx context.Context, items []item) bool {
	// Backoff sleeps end with the stop too.
	sleepCtx, stopSleep := context.WithCancel(ctx)
	defer stopSleep()
	defer context.AfterFunc(runCtx, stopSleep)()
	failures := 0
	var unknownSince map[int64]time.Time
	for len(items) > 0 && ctx.Err() == nil {
		start := time.Now()
		var park []item
		send := make([]relay.Message, 0, len(items))
		sendIdx := make([]int, 0, len(items))
		for i := range items {
			if items[i].err != nil {
				park = append(park, items[i])
				continue
			}
			send = append(send, items[i].msg)
			sendIdx = append(sendIdx, i)
		}
		errs := r.publish(ctx, send)
		var (
			again     []item
			ok        int64
			refused   map[uuid.UUID]bool
			transient error
		)
		for j, i := range sendIdx {
			switch err := errs[j]; {
			case err == nil:
				ok++
			case relay.ReasonOf(err) == relay.ReasonInvalidTopic && r.withinGrace(&unknownSince, items[i].msg.ID):
				again = append(again, items[i])
				if transient == nil && !refused[items[i].msg.AggregateID] {
					transient = fmt.Errorf("topic %s unknown to the broker, retried for up to %s before the event is parked: %w", items[i].msg.Topic, r.cfg.UnknownTopicGrace, err)
				}
			case relay.IsPermanent(err):
				it := items[i]
				it.err = err
				park = append(park, it)
				if refused == nil {
					refused = map[uuid.UUID]bool{}
				}
				refused[it.msg.AggregateID] = true
			default:
				again = append(again, items[i])
				if transient == nil && !refused[items[i].msg.AggregateID] {
					transient = err
				}
			}
		}
		r.published.Add(ok)
		var notParked []item
		if len(park) > 0 {
			if rest, err := r.parkOrDrop(ctx, park); err != nil {
				notParked = rest
				// Not parked: they go round again, in their place.
				again = mergeInOrder(items, again, rest)
				if transient == nil {
					transient = err
				}
			}
		}
		r.observe(start, len(items), send, errs, park, notParked)
		items = again
		if transient == nil {
			failures = 0
			continue
		}
		if ctx.Err() != nil || runCtx.Err() != nil {
			return false // shutting down: not a failure
		}
		failures++
		r.failedBatches.Add(1)
		r.obs.BatchError(transient)
		d := backoff.Delay(r.cfg.BackoffMin, r.cfg.BackoffMax, failures)
		r.log.Warn("wal relay publish failed; retrying the unacknowledged events in order", "err", transient, "events", len(items), "attempt", failures, "retry_in", d.Round(time.Millisecond))
		if !backoff.Sleep(sleepCtx, d) {
			return false
		}
	}
	if len(items) > 0 {
		return false
	}
	r.batches.Add(1)
	return true
}

// withinGrace reports whether the event id, whose topic the broker does
// not know, is still within UnknownTopicGrace of its first such refusal.
func (r *Relayer) withinGrace(since *map[int64]time.Time, id int64) bool {
	if *since == nil {
		*since = map[int64]time.Time{}
	}
	first, ok := (*since)[id]
	if !ok {
		(*since)[id] = time.Now()
		return true
	}
	return time.Since(first) < r.cfg.UnknownTopicGrace
}

// parkOrDrop parks items; when the parked table refuses one with a data
// error (SQLSTATE class 22, e.g. a \u0000 in its JSON), retrying cannot
// help and would hold the stream forever: that one is dropped, logged
// with what identifies it. It returns the items neither parked nor
// dropped, with the error that stopped it.
func (r *Relayer) parkOrDrop(ctx context.Context, items []item) ([]item, error) {
	err := r.park(ctx, items)
	if err == nil {
		return nil, nil
	}
	if !isDataError(err) {
		return items, err
	}
	for i, it := range items {
		err := r.park(ctx, []item{it})
		if err == nil {
			continue
		}
		if !isDataError(err) {
			return items[i:], err
		}
		r.dropped.Add(1)
		r.log.Error("event dropped: it can be neither published nor parked (the parked table refuses it); in plain-insert mode its row stays in the outbox, fix it there and re-insert it to publish it",
			"event_id", it.msg.ID, "aggregate_id", it.msg.AggregateID, "type", clip.Text(it.msg.Type, 200), "reason", relay.ReasonOf(it.err), "publish_err", it.err, "park_err", err)
	}
	return nil, nil
}

// isDataError reports a Postgres data exception (SQLSTATE class 22): the
// values are wrong, the same statement fails again.
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// mergeInOrder returns the items of a and b in their order in all.
func mergeInOrder(all, a, b []item) []item {
	in := make(map[int64]bool, len(a)+len(b))
	for _, it := range a {
		in[it.msg.ID] = true
	}
	for _, it := range b {
		in[it.msg.ID] = true
	}
	out := make([]item, 0, len(a)+len(b))
	for _, it := range all {
		if in[it.msg.ID] {
			out = append(out, it)
		}
	}
	return out
}

// park moves items to the parked table in one transaction, logging each.
func (r *Relayer) park(ctx context.Context, items []item) error {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("park %d events: %w", len(items), err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	for _, it := range items {
		reason := relay.ReasonOf(it.err)
		if reason == "" {
			reason = relay.ReasonBrokerRefused
		}
		why := "wal relay: " + reason
		msg := clip.Text(it.err.Error(), 2000)
		var headers *string
		if it.rawHeaders != nil {
			h := string(it.rawHeaders)
			headers = &h
		}
		created := it.msg.CreatedAt
		if created.IsZero() {
			created = time.Now()
		}
		// JSON payload and headers are kept as they are; anything else as
		// JSON strings (parkRawSQL), so that the parked row is whole.
		sql := r.parkSQL
		if !json.Valid(it.msg.Payload) || (headers != nil && !json.Valid(it.rawHeaders)) {
			sql = r.parkRawSQL
		}
		if _, err := tx.Exec(ctx, sql, it.msg.ID, it.msg.AggregateID, it.msg.Type, string(it.msg.Payload), headers, created, why, msg); err != nil {
			return fmt.Errorf("park event %d: %w", it.msg.ID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("park %d events: %w", len(items), err)
	}
	for _, it := range items {
		r.parked.Add(1)
		r.log.Error("event parked: it cannot be published, so the stream goes on without it; later events of its aggregate are published without it",
			"event_id", it.msg.ID, "aggregate_id", it.msg.AggregateID, "type", clip.Text(it.msg.Type, 200), "reason", relay.ReasonOf(it.err), "err", it.err,
			"unpark", fmt.Sprintf("outbox events unpark %d --yes", it.msg.ID))
	}
	return nil
}
