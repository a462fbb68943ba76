package walrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/lockkey"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
)

// Relayer streams the outbox's committed inserts (and event messages) from
// a logical replication slot to the broker. Any number can run against one
// slot: one leads (a session advisory lock), the others stand by. Create
// it with New, run it with Run.
type Relayer struct {
	cfg        Config
	log        *slog.Logger
	parkSQL    string
	parkRawSQL string
	parkBinSQL string
	prefix     string
	obs        *relay.Observer
	routing    outbox.Routing // the Sink's, for TopicPrefix

	// keepaliveAdvance acknowledges the server's WAL end from keepalives
	// when nothing is unacknowledged; tests turn it off to show that the
	// heartbeat alone moves the slot.
	keepaliveAdvance bool
	// inlineBound is how long a small batch is published on the stream
	// goroutine (streamer.send): the const, or a test's.
	inlineBound time.Duration

	leading                                                        atomic.Bool
	published, parked, dropped, batches, heartbeats, failedBatches atomic.Int64
	claimed, permanent, transient                                  atomic.Int64
	acked                                                          atomic.Uint64
	// progress counts the moves of the acknowledged position: a lead
	// that moved it is a success, which resets the backoff.
	progress atomic.Int64
	// skipped counts the events read again that the lane held already
	// (ExactlyOnce).
	skipped        atomic.Int64
	queuedBytesMax atomic.Int64
	// oldestUnacked is the commit time (Unix ns) of the oldest transaction
	// read and not yet acknowledged; 0 when none.
	oldestUnacked atomic.Int64
	warnedKeep    sync.Once
}

// Stats are the relayer's cumulative counters: relay.Stats, of which the
// WAL source fills every field.
type Stats = relay.Stats

// The WAL source is a relay.Source.
var _ relay.Source = (*Relayer)(nil)

// New validates cfg and applies its defaults.
func New(cfg Config) (*Relayer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	obs, err := relay.NewObserver(cfg.Common)
	if err != nil {
		return nil, err
	}
	routing, err := cfg.Routing()
	if err != nil {
		return nil, err
	}
	return &Relayer{
		cfg:              cfg,
		obs:              obs,
		routing:          routing,
		log:              cfg.Logger.With("outbox", cfg.Tables.OutboxIdent(), "slot", cfg.Slot),
		parkSQL:          render(parkSQL, cfg.Tables),
		parkRawSQL:       render(parkRawSQL, cfg.Tables),
		parkBinSQL:       render(parkBinarySQL, cfg.Tables),
		prefix:           MessagePrefix(cfg.Tables),
		keepaliveAdvance: true,
		inlineBound:      inlineBound,
	}, nil
}

// Config returns the configuration with defaults applied.
func (r *Relayer) Config() Config { return r.cfg }

// Stats returns the cumulative counters.
func (r *Relayer) Stats() Stats {
	return Stats{
		Batches: r.batches.Load(), Claimed: r.claimed.Load(), Dispatched: r.published.Load(),
		PermanentFailures: r.permanent.Load(), TransientFailures: r.transient.Load(), FailedBatches: r.failedBatches.Load(),
		Parked: r.parked.Load(), Dropped: r.dropped.Load(), Heartbeats: r.heartbeats.Load(),
		AckedLSN: r.acked.Load(), Leading: r.leading.Load(), QueuedBytesMax: r.queuedBytesMax.Load(),
	}
}

// Skipped is how many events read again from the slot were not published
// because the lane's committed progress held them already (ExactlyOnce):
// those a crash between a commit and the slot's confirmation, or a
// Postgres crash, made the slot deliver again.
func (r *Relayer) Skipped() int64 { return r.skipped.Load() }

// Lag is how long ago the oldest transaction this relayer has read but the
// broker has not yet acknowledged in full committed: the slot's lag in
// time, as the leader sees it (0 on a standby, or when all is
// acknowledged). Lag (the function) gives the lag in bytes from any
// session.
func (r *Relayer) Lag() time.Duration {
	ns := r.oldestUnacked.Load()
	if ns == 0 {
		return 0
	}
	return max(time.Since(time.Unix(0, ns)), 0)
}

// Run relays until ctx is cancelled, then lets the batch in flight finish
// (within ShutdownTimeout), acknowledges it and returns nil. It stands by
// until it holds the slot's leader lock, then streams. It returns an error
// when it cannot start (schema out of date, wal_level not logical) or must
// not go on: the slot was invalidated or disappeared (ErrSlotLost), a
// process other than a relayer reads it (ErrSlotBusy), or Messages is on
// while roles other than the producers can write messages
// (ErrMessagesOpen). Database and
// broker outages, the loss of the leader's session and a previous
// leader's stream still holding the slot are ridden out: it steps down
// and stands by again.
func (r *Relayer) Run(ctx context.Context) error {
	if !r.cfg.SkipSchemaCheck {
		m, err := migrate.New(r.cfg.Tables)
		if err != nil {
			return err
		}
		// Stopped while starting is a stop, not a failure (as relay.Run).
		if err := m.Validate(ctx, r.cfg.Pool); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("walrelay: %w", err)
		}
	}
	if err := checkWALLevel(ctx, r.cfg.Pool); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if r.cfg.Messages {
		if err := CheckMessages(ctx, r.cfg.Pool, r.cfg.Tables); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	if err := r.checkLegacySlot(ctx); err != nil {
		if ctx.Err() != nil && !errors.Is(err, ErrLegacySlot) {
			return nil
		}
		return err
	}
	r.log.Info("wal relay started; waiting to lead", "publication", r.cfg.Publication, "batch_size", r.cfg.BatchSize, "heartbeat_interval", r.cfg.HeartbeatInterval)
	defer r.log.Info("wal relay stopped")
	bo := leaderBackoff{min: r.cfg.BackoffMin, max: r.cfg.BackoffMax}
	for ctx.Err() == nil {
		lock, err := r.takeLead(ctx)
		if err == nil && lock == nil {
			bo.standby()
			if !backoff.Sleep(ctx, r.cfg.LeaderPollInterval) {
				return nil
			}
			continue
		}
		if err == nil {
			progress := r.progress.Load()
			err = r.lead(ctx, lock)
			lock.Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing releases the lock either way
			r.leading.Store(false)
			r.oldestUnacked.Store(0)
			bo.led(r.progress.Load() != progress)
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrSlotLost) || errors.Is(err, ErrSlotBusy) || errors.Is(err, ErrWALLevel) || errors.Is(err, ErrMessagesOpen) || errors.Is(err, ErrNotThisOutbox) || errors.Is(err, ErrPendingBeforeSlot) {
			return err
		}
		if !backoff.Sleep(ctx, r.steppedDown(err, &bo)) {
			return nil
		}
	}
	return nil
}

// steppedDown logs why the lead ended with err and returns how long to
// stand by before trying to lead again.
func (r *Relayer) steppedDown(err error, bo *leaderBackoff) time.Duration {
	// A step-down is not a failed batch: settle counts those. Waiting
	// out a previous leader's stream is no failure either: each try
	// already waited SlotBusyTimeout, so the next comes soon.
	var d time.Duration
	switch {
	case errors.Is(err, relay.ErrFenced):
		d = r.cfg.LeaderPollInterval
		r.log.Warn("wal relay lost the lane to another relayer: it stepped down; standing by again", "err", err, "retry_in", d.Round(time.Millisecond))
	case errors.Is(err, errSlotHeldByRelayer):
		d = r.cfg.LeaderPollInterval
		r.log.Info("wal relay stepped down: the slot is still read by a relayer's stream (a previous leader's, not ended yet); standing by again", "err", err, "retry_in", d.Round(time.Millisecond))
	default:
		var attempt int
		attempt, d = bo.failed()
		r.log.Warn("wal relay stepped down; standing by again", "err", err, "attempt", attempt, "retry_in", d.Round(time.Millisecond))
	}
	return d
}

// checkLegacySlot refuses to start under the default names when the
// outbox's position is held by a slot of an earlier version's default name
// (ErrLegacySlot): a new slot would skip what is pending in the old one.
func (r *Relayer) checkLegacySlot(ctx context.Context) error {
	if !r.cfg.defaultNames {
		return nil
	}
	old, err := legacySlot(ctx, r.cfg.Pool, r.cfg.Tables, r.cfg.Slot)
	if err != nil {
		return err
	}
	if old != "" {
		return fmt.Errorf("%w: slot %s holds this outbox's position and there is no slot %s (this version's default): set Config.Slot and Config.Publication to %s (--slot %s --publication %s) to go on from it; a new slot would start at the current position and skip what is pending in the old one", ErrLegacySlot, old, r.cfg.Slot, old, old, old)
	}
	return nil
}

// takeLead opens a session and tries the leader lock on it. It returns
// the session holding the lock, or nil when another relayer leads.
func (r *Relayer) takeLead(ctx context.Context) (*pgx.Conn, error) {
	cc := r.cfg.Pool.Config().ConnConfig.Copy()
	cc.RuntimeParams["application_name"] = r.appName("leader")
	maps.Copy(cc.RuntimeParams, keepaliveParams)
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connect for the leader lock: %w", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, leaderLockSQL, lockkey.WALSlot(r.cfg.Slot), lockkey.WALSlotID).Scan(&got); err != nil {
		conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // reporting the query's error
		return nil, fmt.Errorf("take the leader lock: %w", err)
	}
	if !got {
		conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // nothing held
		return nil, nil
	}
	idle := max(10*r.cfg.LeaderPollInterval, minLeaderIdle)
	if _, err := conn.Exec(ctx, leaderIdleSQL, fmt.Sprintf("%dms", idle.Milliseconds())); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42704" { // undefined_object: before Postgres 14
			conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // reporting the query's error
			return nil, fmt.Errorf("set the leader session's idle_session_timeout: %w", err)
		}
	}
	return conn, nil
}

// minLeaderIdle is the shortest idle_session_timeout of the leader's lock
// session (leaderIdleSQL): a leader stalled this long (a GC pause, a
// starved CPU) loses the lead, so it is far longer than any stall a
// running relayer has.
const minLeaderIdle = 10 * time.Second

// streamAppName starts the application_name of every relayer's
// replication connection: a slot read by such a process is a previous
// leader's, to be waited out, not a foreign reader.
const streamAppName = "outbox-wal stream"

// errSlotHeldByRelayer: the slot is still read by a relayer's stream (a
// leader cut off or just dead whose walsender the server has not ended
// yet). The new leader steps down and tries again.
var errSlotHeldByRelayer = errors.New("the slot is still read by a previous leader's stream")

// keepaliveParams make the server notice a relayer cut off by the network
// (no FIN, no RST) within about 25s: TCP keepalives after 10s idle, every
// 5s, 3 lost; and tcp_user_timeout ends the connection when data it sent
// (a walsender's stream, a reply to the leader's ping) stays
// unacknowledged for 25s. The leader's session then ends, releasing the
// leader lock, and so does its walsender, releasing the slot. Ignored on
// Unix sockets.
var keepaliveParams = map[string]string{
	"tcp_keepalives_idle":     "10",
	"tcp_keepalives_interval": "5",
	"tcp_keepalives_count":    "3",
	"tcp_user_timeout":        "25000",
}

func (r *Relayer) appName(role string) string {
	n := "outbox-wal " + role
	if r.cfg.Name != "" {
		n += " " + r.cfg.Name
	}
	return n
}

// lead runs the leader's stream while lock holds the leader lock. It
// returns when ctx ends, the lock's session dies (another relayer may
// lead by then: the stream must stop), or the stream fails.
//
// runCtx is Run's context: when it ends, the batch in flight is let finish
// (ShutdownTimeout); when only ctx ends (the lock was lost), it is not.
func (r *Relayer) lead(runCtx context.Context, lock *pgx.Conn) error {
	ctx, cancel := context.WithCancelCause(runCtx)
	defer cancel(nil)
	r.log.Info("wal relay took the leader lock")
	if !r.cfg.SkipSetup {
		if err := Setup(ctx, lock, r.cfg.Tables, r.cfg.Slot, r.cfg.Publication); err != nil {
			return err
		}
	}
	// Checked again on each takeover: a standby may have waited long
	// since Run checked.
	if r.cfg.Messages {
		if err := CheckMessages(ctx, lock, r.cfg.Tables); err != nil {
			return err
		}
	}
	// Before anything is streamed, so nothing is confirmed: a
	// publication of another table streams nothing of this outbox.
	if err := checkPublication(ctx, lock, r.cfg.Tables, r.cfg.Publication); err != nil {
		return err
	}
	var start pglogrepl.LSN
	if !r.cfg.ExactlyOnce {
		var err error
		if start, err = r.checkSlot(ctx, lock); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel(nil)
	// The lock's session is watched: if it ends (killed, network), another
	// relayer can take the lock, and two must never stream.
	wg.Go(func() {
		t := time.NewTicker(max(r.cfg.LeaderPollInterval/2, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			err := lock.Ping(pctx)
			pcancel()
			if err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("the leader lock's session was lost: %w", err))
				return
			}
		}
	})
	if r.cfg.HeartbeatInterval > 0 {
		wg.Go(func() { r.heartbeat(ctx) })
	}
	var err error
	if r.cfg.ExactlyOnce {
		// The lock's session is the watcher's from here on: the slot
		// is read through the pool.
		err = r.streamExactlyOnce(ctx, runCtx, r.cfg.Pool)
	} else {
		err = r.stream(ctx, runCtx, start, nil)
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// checkSlot checks the slot before streaming and returns its confirmed
// position: lost is fatal; active in another process is waited on for
// SlotBusyTimeout (a leader that just died), then fatal, unless that
// process is a relayer's stream (errSlotHeldByRelayer: step down, retry).
func (r *Relayer) checkSlot(ctx context.Context, db outbox.DB) (pglogrepl.LSN, error) {
	var keep string
	if err := db.QueryRow(ctx, `SELECT current_setting('max_slot_wal_keep_size')`).Scan(&keep); err == nil && keep == "-1" {
		r.warnedKeep.Do(func() {
			r.log.Warn("max_slot_wal_keep_size is -1 (unlimited): if this relay stops for long, the slot keeps WAL until the disk fills; set a limit (ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf()) and alert on the slot's lag")
		})
	}
	deadline := time.Now().Add(r.cfg.SlotBusyTimeout)
	for {
		var (
			status, confirmed, plugin string
			pid                       *int32
			sameDB                    bool
		)
		err := db.QueryRow(ctx, slotSQL, r.cfg.Slot).Scan(&status, &pid, &confirmed, &plugin, &sameDB)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, fmt.Errorf("walrelay: no replication slot %s: let the relay create it (do not set SkipSetup / --skip-setup) or create it with walrelay.Setup", r.cfg.Slot)
		}
		if err != nil {
			return 0, fmt.Errorf("read slot %s: %w", r.cfg.Slot, err)
		}
		switch {
		case status == "lost":
			return 0, fmt.Errorf("%w: slot %s has wal_status=lost (it fell behind max_slot_wal_keep_size and the WAL it needed is gone; events after its position %s may be missing): drop it (outbox relay --mode wal --teardown), republish the gap from the table (outbox relay --mode poll) and start again", ErrSlotLost, r.cfg.Slot, confirmed)
		case plugin != "pgoutput" || !sameDB:
			if err := checkSlotHome(ctx, db, r.cfg.Slot); err != nil {
				return 0, err
			}
			continue // changed meanwhile: read it again
		case pid == nil:
			lsn, err := pglogrepl.ParseLSN(confirmed)
			if err != nil {
				return 0, fmt.Errorf("slot %s: confirmed_flush_lsn %q: %w", r.cfg.Slot, confirmed, err)
			}
			return lsn, nil
		case time.Now().After(deadline):
			var app string
			if err := db.QueryRow(ctx, streamHolderSQL, *pid).Scan(&app); err != nil {
				return 0, fmt.Errorf("read the reader of slot %s: %w", r.cfg.Slot, err)
			}
			if strings.HasPrefix(app, streamAppName) {
				// This relayer holds the lock: that stream's leader lost
				// it. End the stream rather than wait for the server to
				// (wal_sender_timeout), and read the slot again.
				r.log.Warn("ending a previous leader's stream, which still reads the slot after its leader lost the lock", "slot", r.cfg.Slot, "pid", *pid, "application_name", app)
				if _, err := db.Exec(ctx, takeSlotSQL, *pid); err != nil {
					return 0, fmt.Errorf("%w: slot %s is still read by process %d (%q) after %s, and ending it failed (%w); the server ends it once it notices (keepalives, wal_sender_timeout)", errSlotHeldByRelayer, r.cfg.Slot, *pid, app, r.cfg.SlotBusyTimeout, err)
				}
				deadline = time.Now().Add(r.cfg.SlotBusyTimeout)
				continue
			}
			return 0, fmt.Errorf("%w: slot %s is read by process %d, which does not hold the outbox relay's leader lock: stop that reader (SELECT pg_terminate_backend(%d)) or give this relay another --slot", ErrSlotBusy, r.cfg.Slot, *pid, *pid)
		}
		if !backoff.Sleep(ctx, 200*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
}

// heartbeat writes a non-transactional logical message every
// HeartbeatInterval while this relayer leads.
func (r *Relayer) heartbeat(ctx context.Context) {
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.cfg.Pool.Exec(ctx, heartbeatSQL); err != nil && ctx.Err() == nil {
			r.log.Warn("wal relay heartbeat failed; the slot may lag while the outbox is idle", "err", err)
		}
	}
}
