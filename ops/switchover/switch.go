package switchover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/cleanuplock"
	"github.com/pgoutbox/outbox/internal/durations"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// Switching an outbox between the polling relay and the WAL source
// (`outbox switch to-wal`, `outbox switch to-poll`) without losing an event
// or breaking an aggregate's order. The functions here do the database's
// part of each direction and wait where the procedure waits; stopping and
// starting the relayers stays with the operator, between the steps they
// return after. docs/wal.md ("Switching between the polling relay and the
// WAL source") explains why each cut is exact.
//
// Poll -> WAL (PrepareSwitchToWAL): once the slot exists every event
// committed later is in it, so an event it lacks was committed before and
// is visible to a statement run after, with an id at most that statement's
// max(id): the cut. When the polling relayers have dispatched every row up
// to the cut, everything older than the slot is in Kafka, and the WAL
// source may start.
//
// WAL -> poll (PrepareSwitchToPoll): a REPEATABLE READ transaction whose
// first statement reads pg_current_wal_insert_lsn(), the cut, and so takes
// its snapshot: every row the snapshot sees committed before the cut. Once
// the slot's confirmed_flush_lsn passes the cut the broker has all of
// them, and an UPDATE in that transaction marks exactly them dispatched.
// An id cannot serve as this cut: a row with a lower id that commits late
// would be marked and never published.

// Switch defaults.
const (
	// DefaultSwitchToWALTimeout bounds PrepareSwitchToWAL's wait for the
	// polling relayers: a held row waits for an operator.
	DefaultSwitchToWALTimeout = 5 * time.Minute
	// DefaultSwitchToPollTimeout bounds PrepareSwitchToPoll: a streaming
	// relayer confirms at least every second.
	DefaultSwitchToPollTimeout = 2 * time.Minute
	// DefaultSwitchPollInterval is how often a switch reads what it waits
	// for.
	DefaultSwitchPollInterval = 50 * time.Millisecond
	// DefaultSwitchProgressInterval is how often a switch reports progress
	// while it waits.
	DefaultSwitchProgressInterval = time.Second
	// DefaultReaderGrace is how long PrepareSwitchToPoll waits for a WAL
	// relayer to read the slot when none does (one starting, or a standby
	// taking over) before it gives up.
	DefaultReaderGrace = 5 * time.Second
	// DefaultHeldLimit is how many held rows a switch lists.
	DefaultHeldLimit = 10
)

// Errors of the switch functions, wrapped in a message that says what to
// do. Check them with errors.Is.
var (
	// ErrNoSlot: PrepareSwitchToPoll found no replication slot, so there
	// is no WAL source whose work to mark.
	ErrNoSlot = errors.New("ops: the outbox has no replication slot")
	// ErrSlotNotStreamed: no WAL relayer reads the slot (or something
	// else does), so its confirmed position would never pass the cut, or
	// would not say what the broker has.
	ErrSlotNotStreamed = errors.New("ops: no WAL relayer streams the replication slot")
	// ErrSlotInUse: PrepareSwitchToWAL found the slot already read: the
	// WAL source runs on this outbox already.
	ErrSlotInUse = errors.New("ops: the replication slot is already being read")
	// ErrSwitchTimeout: what the switch waits for did not happen within
	// its Timeout. Nothing was undone or half done: run it again.
	ErrSwitchTimeout = errors.New("ops: the switch did not finish in time")
)

// walStreamAppName starts the application_name of a WAL relayer's
// replication connection ("outbox-wal stream [name]", see
// walrelay.Config.Name): the only reader whose confirmed position means
// the broker has the events.
const walStreamAppName = "outbox-wal stream"

// WALSetup is what SetupWAL found or created.
type WALSetup struct {
	Slot, Publication string
	// PublicationCreated and SlotCreated are false when they existed.
	PublicationCreated, SlotCreated bool
	// SlotLSN is the slot's confirmed position: every event committed
	// after it is in the slot (for a new slot, its creation point).
	SlotLSN string
	// ReaderPID is the process reading the slot (0: none), ReaderName its
	// application_name; a WAL relayer's starts with "outbox-wal stream".
	ReaderPID  int32
	ReaderName string
}

// SetupWAL creates the publication and the replication slot of an outbox
// as `outbox relay --mode wal` does at start (walrelay.Setup: it marks
// the publication once the slot exists, so a later relay --mode wal takes
// the slot as its own), and reports what it created and where the slot
// starts. It is idempotent. Empty slot and publication names mean the WAL
// relay's defaults (walrelay.Names). The role needs REPLICATION and
// must own the publication; the server needs wal_level=logical.
//
// Creating a slot waits for the transactions open at that moment to end.
// Events committed before the slot exists are not in it: to move an
// outbox from the polling relay, use PrepareSwitchToWAL, which calls this.
func SetupWAL(ctx context.Context, db outbox.DB, tables outbox.Tables, slot, publication string) (WALSetup, error) {
	if err := tables.Validate(); err != nil {
		return WALSetup{}, err
	}
	tables = tables.WithDefaults()
	// The publication's default name is the slot's.
	var s WALSetup
	var err error
	if s.Slot, s.Publication, _, err = walrelay.Names(ctx, db, tables, slot, publication); err != nil {
		return s, err
	}
	var pubExists, slotExists bool
	if err := db.QueryRow(ctx, switchSetupStateSQL, s.Publication, s.Slot).Scan(&pubExists, &slotExists); err != nil {
		return s, fmt.Errorf("ops: look up publication %s and slot %s: %w", s.Publication, s.Slot, err)
	}
	if err := walrelay.SetupAllowPending(ctx, db, tables, s.Slot, s.Publication); err != nil {
		return s, err
	}
	s.PublicationCreated, s.SlotCreated = !pubExists, !slotExists
	st, found, err := readSlotState(ctx, db, s.Slot, "")
	if err != nil {
		return s, err
	}
	if !found {
		return s, fmt.Errorf("%w: slot %s disappeared right after it was set up (dropped by another session?): run again", ErrNoSlot, s.Slot)
	}
	s.SlotLSN, s.ReaderName = st.confirmed, st.app
	if st.active {
		s.ReaderPID = st.pid
	}
	return s, nil
}

// ReadWALCut reads the poll -> WAL cut: the highest id committed, and how
// many rows up to it are still pending. Read once the slot exists, every
// event the slot lacks has an id at most cut; a polling relayer must
// dispatch the pending ones before the WAL source starts.
func ReadWALCut(ctx context.Context, db outbox.DB, tables outbox.Tables) (cut, pending int64, err error) {
	if err := tables.Validate(); err != nil {
		return 0, 0, err
	}
	tables = tables.WithDefaults()
	if err := db.QueryRow(ctx, render(switchCutSQL, tables)).Scan(&cut); err != nil {
		return 0, 0, fmt.Errorf("ops: read the highest id of %s: %w", tables.OutboxIdent(), err)
	}
	pending, _, err = readPendingUpTo(ctx, db, tables, cut)
	return cut, pending, err
}

// SwitchToWALConfig configures PrepareSwitchToWAL.
type SwitchToWALConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// Slot and Publication name what the WAL source reads. Default to
	// the WAL relay's (walrelay.Names), as for `outbox relay --mode wal`.
	Slot, Publication string
	// Timeout bounds the wait for the polling relayers. Defaults to
	// DefaultSwitchToWALTimeout (5m).
	Timeout time.Duration
	// PollInterval is how often the pending rows are counted. Defaults to
	// DefaultSwitchPollInterval (50ms).
	PollInterval time.Duration
	// Progress, when set, is called about every ProgressInterval while
	// rows up to the cut are pending. Defaults to nil.
	Progress func(DrainProgress)
	// ProgressInterval defaults to DefaultSwitchProgressInterval (1s).
	ProgressInterval time.Duration
	// HeldLimit caps the held rows listed in progress and errors.
	// Defaults to DefaultHeldLimit (10).
	HeldLimit int
}

// DrainProgress is where PrepareSwitchToWAL's wait stands.
type DrainProgress struct {
	// Cut is the highest id the polling relayers must dispatch.
	Cut int64
	// Pending rows up to the cut; Blocked of them are held (a relayer
	// recorded a permanent failure) or wait behind a held row of their
	// aggregate: they go only once an operator acts.
	Pending, Blocked int64
	// Held lists the first held rows up to the cut (HeldLimit).
	Held    []ops.StuckRow
	Elapsed time.Duration
}

// SwitchToWALResult is what PrepareSwitchToWAL did.
type SwitchToWALResult struct {
	Setup WALSetup
	// Cut is the highest id committed once the slot existed;
	// PendingAtCut the rows up to it that were pending then.
	Cut, PendingAtCut int64
	// Waited is how long the polling relayers took to dispatch them.
	Waited time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults,
// Slot and Publication excepted: their defaults depend on the database
// (walrelay.Names), so PrepareSwitchToWAL fills them. Negative values are
// left for Validate to refuse.
func (c SwitchToWALConfig) WithDefaults() SwitchToWALConfig {
	c.Tables = c.Tables.WithDefaults()
	durations.Fill(c.durations())
	if c.HeldLimit == 0 {
		c.HeldLimit = DefaultHeldLimit
	}
	return c
}

func (c *SwitchToWALConfig) durations() []durations.Default {
	return []durations.Default{
		{Name: "Timeout", V: &c.Timeout, Def: DefaultSwitchToWALTimeout},
		{Name: "PollInterval", V: &c.PollInterval, Def: DefaultSwitchPollInterval},
		{Name: "ProgressInterval", V: &c.ProgressInterval, Def: DefaultSwitchProgressInterval},
	}
}

// Validate reports a bad table name, a negative duration or HeldLimit.
func (c SwitchToWALConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	if err := durations.Check("SwitchToWALConfig", c.durations()); err != nil {
		return err
	}
	if c.HeldLimit < 0 {
		return fmt.Errorf("ops: SwitchToWALConfig HeldLimit is %d; use a positive number, or 0 for the default %d", c.HeldLimit, DefaultHeldLimit)
	}
	return nil
}

// PrepareSwitchToWAL does the database's part of moving an outbox from
// the polling relay to the WAL source, while the polling relayers run:
// it creates the publication and the slot (SetupWAL), reads the cut
// (ReadWALCut) and waits until the polling relayers have dispatched every
// row up to it. Then everything the slot lacks is in Kafka: stop the
// polling relayers (SIGTERM) and start `outbox relay --mode wal`, in that
// order, which is the operator's part. A WAL relayer started before the
// wait ends would publish new events of an aggregate while the polling
// relayers still publish its old ones: the wait stops with ErrSlotInUse
// when a process reads the slot.
//
// A held row (its relayer recorded a permanent failure) is never
// dispatched by itself: the wait reports it through Progress, and fails
// with ErrSwitchTimeout naming it. Run again after `outbox events retry`
// or `park`: it is idempotent. It refuses with ErrSlotInUse when the slot
// is already read, since the WAL source then runs already. Until a WAL
// relayer reads it, the slot keeps WAL on the server's disk.
func PrepareSwitchToWAL(ctx context.Context, pool *pgxpool.Pool, cfg SwitchToWALConfig) (SwitchToWALResult, error) {
	var res SwitchToWALResult
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	var err error
	if cfg.Slot, cfg.Publication, _, err = walrelay.Names(ctx, pool, cfg.Tables, cfg.Slot, cfg.Publication); err != nil {
		return res, err
	}
	st, found, err := readSlotState(ctx, pool, cfg.Slot, "")
	if err != nil {
		return res, err
	}
	if found && st.active {
		if st.streamedByRelayer() || st.startingRelayer() {
			return res, fmt.Errorf("%w: slot %s is read by a WAL relayer (pid %d, %q): the WAL source already runs on %s, so there is nothing to prepare; if polling relayers still run on it, stop them now (SIGTERM): both publish the same events", ErrSlotInUse, cfg.Slot, st.pid, st.app, cfg.Tables.OutboxIdent())
		}
		return res, fmt.Errorf("%w: slot %s is read by pid %d (%q), which is not a WAL relayer; stop that reader, or name another slot", ErrSlotInUse, cfg.Slot, st.pid, st.app)
	}
	if res.Setup, err = SetupWAL(ctx, pool, cfg.Tables, cfg.Slot, cfg.Publication); err != nil {
		return res, err
	}
	if res.Cut, res.PendingAtCut, err = ReadWALCut(ctx, pool, cfg.Tables); err != nil {
		return res, err
	}
	start := time.Now()
	deadline := start.Add(cfg.Timeout)
	// Each ProgressInterval (the first time once a whole one has passed):
	// a progress report, and a look at the slot.
	tick := start
	for first := true; ; first = false {
		if !first && !backoff.Sleep(ctx, cfg.PollInterval) {
			return res, ctx.Err()
		}
		pending, blocked, err := readPendingUpTo(ctx, pool, cfg.Tables, res.Cut)
		if err != nil {
			return res, err
		}
		res.Waited = time.Since(start)
		if pending == 0 {
			return res, nil
		}
		late := time.Now().After(deadline)
		if !late && time.Since(tick) < cfg.ProgressInterval {
			continue
		}
		tick = time.Now()
		// A WAL relayer started before the wait ends would send new
		// events of an aggregate while old ones are still going out.
		if st, found, err := readSlotState(ctx, pool, cfg.Slot, ""); err != nil {
			return res, err
		} else if found && st.active {
			return res, fmt.Errorf("%w: slot %s is read by pid %d (%q) while %d row(s) up to id %d (the cut) are still pending: a WAL relayer started before the polling relayers had published everything older than the slot, so events of an aggregate can go out of order; stop it (SIGTERM), run the switch again, and start it once the switch says so", ErrSlotInUse, cfg.Slot, st.pid, st.app, pending, res.Cut)
		}
		if !late && cfg.Progress == nil {
			continue
		}
		p := DrainProgress{Cut: res.Cut, Pending: pending, Blocked: blocked, Elapsed: res.Waited}
		if blocked > 0 {
			if p.Held, err = readHeldUpTo(ctx, pool, cfg.Tables, res.Cut, cfg.HeldLimit); err != nil {
				return res, err
			}
		}
		if late {
			return res, drainTimeout(cfg, p)
		}
		cfg.Progress(p)
	}
}

func drainTimeout(cfg SwitchToWALConfig, p DrainProgress) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d row(s) of %s up to id %d are still pending after %s, so the polling relayers have not published everything the slot lacks; ",
		p.Pending, cfg.Tables.OutboxIdent(), p.Cut, cfg.Timeout)
	if p.Blocked > 0 {
		fmt.Fprintf(&b, "%d of them are held after a permanent failure or wait behind a held row of their aggregate (held: %s): fix the cause and run 'outbox events retry ID --yes', or 'outbox events park ID --reason TEXT --yes' to let the rest of the aggregate go ('outbox watchdog' lists them); ", p.Blocked, heldList(p.Held))
	}
	if p.Pending > p.Blocked {
		b.WriteString("is a polling relayer (outbox relay) running on this outbox? ('outbox stats' shows the dispatch rate); ")
	}
	fmt.Fprintf(&b, "the slot %s stays and keeps WAL until a WAL relayer reads it: run the switch again to go on waiting, or drop it (outbox relay --mode wal --teardown) to stay on polling", cfg.Slot)
	return fmt.Errorf("%w: %s", ErrSwitchTimeout, b.String())
}

// heldList names held rows for an error: "123 (broker_refused), 130
// (too_large)".
func heldList(held []ops.StuckRow) string {
	if len(held) == 0 {
		return "none listed"
	}
	parts := make([]string, len(held))
	for i, h := range held {
		parts[i] = fmt.Sprintf("%d (%s)", h.ID, h.Reason)
	}
	return strings.Join(parts, ", ")
}

// readPendingUpTo counts the rows up to cut still pending, and those of
// them held or behind a held row.
func readPendingUpTo(ctx context.Context, db outbox.DB, tables outbox.Tables, cut int64) (pending, blocked int64, err error) {
	if err := db.QueryRow(ctx, render(switchPendingSQL, tables), cut).Scan(&pending, &blocked); err != nil {
		return 0, 0, fmt.Errorf("ops: count the pending rows of %s up to id %d: %w", tables.OutboxIdent(), cut, err)
	}
	return pending, blocked, nil
}

// readHeldUpTo lists the first limit held rows up to cut.
func readHeldUpTo(ctx context.Context, db outbox.DB, tables outbox.Tables, cut int64, limit int) ([]ops.StuckRow, error) {
	rows, err := db.Query(ctx, render(switchHeldSQL, tables), cut, limit)
	if err != nil {
		return nil, fmt.Errorf("ops: list the held rows of %s up to id %d: %w", tables.OutboxIdent(), cut, err)
	}
	held, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ops.StuckRow, error) {
		var s ops.StuckRow
		var age float64
		var heldUntil *time.Time
		if err := r.Scan(&s.ID, &s.AggregateID, &s.Type, &s.CreatedAt, &age, &s.Reason, &s.LastError, &s.Attempts, &s.FailedAt, &heldUntil); err != nil {
			return s, err
		}
		s.Age = time.Duration(age * float64(time.Second))
		if heldUntil != nil {
			s.HeldUntil = *heldUntil
		}
		return s, nil
	})
	if err != nil {
		return nil, fmt.Errorf("ops: list the held rows of %s up to id %d: %w", tables.OutboxIdent(), cut, err)
	}
	return held, nil
}

// SwitchToPollConfig configures PrepareSwitchToPoll.
type SwitchToPollConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// Slot is the WAL source's slot. Defaults to the WAL relay's
	// (walrelay.Names).
	Slot string
	// Timeout bounds the whole call. Defaults to
	// DefaultSwitchToPollTimeout (2m).
	Timeout time.Duration
	// ReaderGrace is how long a slot may have no reader (a relayer
	// starting, a standby taking over) before the call gives up with
	// ErrSlotNotStreamed. Defaults to DefaultReaderGrace (5s).
	ReaderGrace time.Duration
	// PollInterval is how often the slot is read. Defaults to
	// DefaultSwitchPollInterval (50ms).
	PollInterval time.Duration
	// Progress, when set, is called about every ProgressInterval while
	// the call waits for the slot. Defaults to nil.
	Progress func(ConfirmProgress)
	// ProgressInterval defaults to DefaultSwitchProgressInterval (1s).
	ProgressInterval time.Duration
}

// ConfirmProgress is where PrepareSwitchToPoll's wait stands.
type ConfirmProgress struct {
	// InTransaction is false while the relayer catches up before the
	// marking transaction opens, true while the transaction waits for
	// the slot to pass its cut.
	InTransaction bool
	// Target is the WAL position waited for, Confirmed the slot's.
	Target, Confirmed string
	// ReaderPID is the WAL relayer's walsender (0: none right now).
	ReaderPID int32
	Elapsed   time.Duration
}

// SwitchToPollResult is what PrepareSwitchToPoll did.
type SwitchToPollResult struct {
	Slot string
	// Cut is the WAL position read as the marking transaction's first
	// statement: every row marked committed before it.
	Cut string
	// Marked is how many rows were set dispatched.
	Marked int64
	// ReaderPID and ReaderName are the WAL relayer's walsender that
	// confirmed the cut.
	ReaderPID  int32
	ReaderName string
	// CatchUp is the wait before the transaction, Transaction how long
	// the transaction (and its snapshot) lasted, Attempts how many
	// transactions it took (a concurrent delete of a row, the WAL
	// relayer parking one, makes a REPEATABLE READ transaction retry).
	CatchUp, Transaction time.Duration
	Attempts             int
}

// WithDefaults returns c with its zero fields set to their defaults,
// Slot excepted: its default depends on the database (walrelay.Names), so
// PrepareSwitchToPoll fills it. Negative values are left for Validate to
// refuse.
func (c SwitchToPollConfig) WithDefaults() SwitchToPollConfig {
	c.Tables = c.Tables.WithDefaults()
	durations.Fill(c.durations())
	return c
}

func (c *SwitchToPollConfig) durations() []durations.Default {
	return []durations.Default{
		{Name: "Timeout", V: &c.Timeout, Def: DefaultSwitchToPollTimeout},
		{Name: "ReaderGrace", V: &c.ReaderGrace, Def: DefaultReaderGrace},
		{Name: "PollInterval", V: &c.PollInterval, Def: DefaultSwitchPollInterval},
		{Name: "ProgressInterval", V: &c.ProgressInterval, Def: DefaultSwitchProgressInterval},
	}
}

// Validate reports a bad table name or a negative duration.
func (c SwitchToPollConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	return durations.Check("SwitchToPollConfig", c.durations())
}

// maxMarkAttempts bounds the marking transactions PrepareSwitchToPoll
// tries when a concurrent change to a row makes one fail.
const maxMarkAttempts = 5

// PrepareSwitchToPoll does the database's part of moving an outbox from
// the WAL source back to the polling relay, while a WAL relayer streams
// the slot: it marks dispatched exactly the rows the WAL source has
// published, in one REPEATABLE READ transaction (the cut,
// pg_current_wal_insert_lsn(), as its first statement; a wait until the
// slot's confirmed_flush_lsn passes the cut; an UPDATE of the rows with
// dispatched_at NULL that its snapshot sees). Rows committed after the
// cut stay pending, for the polling relay. Then stop the WAL relayers
// (SIGTERM), drop the slot and the publication (`outbox relay --mode wal
// --teardown`) and start `outbox relay`, in that order, which is the
// operator's part.
//
// The transaction holds back vacuum while it lasts, so it is kept short:
// the call first waits, outside it, for the relayer to confirm the
// current WAL position, and writes a heartbeat message after each cut so
// that the relayer confirms past it without waiting for its own. It holds
// the outbox's cleanup lock meanwhile, so that retention cleanup deletes
// no row under it.
//
// It fails with ErrNoSlot when there is no slot, ErrSlotNotStreamed when
// no WAL relayer reads it for ReaderGrace (the slot would never pass the
// cut) or another process does, walrelay.ErrSlotLost when the slot was
// invalidated, and ErrSwitchTimeout after Timeout; each leaves the table
// as it was. The pool needs two connections: the transaction holds one
// while the slot is read on the other. Producers must write plain
// inserts (a row per event) before this direction: events written as
// insert+delete or logical messages have no row for a poller to read.
func PrepareSwitchToPoll(ctx context.Context, pool *pgxpool.Pool, cfg SwitchToPollConfig) (SwitchToPollResult, error) {
	res := SwitchToPollResult{Slot: cfg.Slot}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	var err error
	if pool.Config().MaxConns < 2 {
		// The transaction holds one connection while the slot is read on
		// another.
		return res, fmt.Errorf("ops: PrepareSwitchToPoll needs a pool of at least 2 connections; this one has MaxConns %d", pool.Config().MaxConns)
	}
	if cfg.Slot, err = ops.SlotName(ctx, pool, cfg.Tables, cfg.Slot); err != nil {
		return res, err
	}
	res.Slot = cfg.Slot
	start := time.Now()
	w := &slotWaiter{pool: pool, cfg: cfg, start: start, deadline: start.Add(cfg.Timeout)}
	// Catch up outside the transaction, so that the snapshot is held for
	// about one status interval of the relayer, not for its backlog.
	var here string
	if err := pool.QueryRow(ctx, switchWALPositionSQL).Scan(&here); err != nil {
		return res, fmt.Errorf("ops: read the WAL position: %w", err)
	}
	if _, err := w.wait(ctx, here, false); err != nil {
		return res, err
	}
	res.CatchUp = time.Since(start)

	conn, unlock, err := w.lockCleanup(ctx)
	if err != nil {
		return res, err
	}
	defer unlock()
	for {
		res.Attempts++
		began := time.Now()
		st, marked, cut, err := w.mark(ctx, conn.Conn())
		res.Transaction, res.Cut = time.Since(began), cut
		var pgErr *pgconn.PgError
		// A row the snapshot sees changed meanwhile (40001), or the
		// UPDATE deadlocked with a WAL relayer parking rows (40P01):
		// nothing was marked; again, with a new cut.
		if errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") && res.Attempts < maxMarkAttempts {
			continue
		}
		if err != nil {
			return res, err
		}
		res.Marked, res.ReaderPID, res.ReaderName = marked, st.pid, st.app
		return res, nil
	}
}

// slotWaiter waits for a slot to confirm WAL positions, within one
// switch's deadline.
type slotWaiter struct {
	pool            *pgxpool.Pool
	cfg             SwitchToPollConfig
	start, deadline time.Time
}

// mark runs the marking transaction once on conn: the cut, the wait for
// the slot to pass it, the UPDATE.
func (w *slotWaiter) mark(ctx context.Context, conn *pgx.Conn) (st slotState, marked int64, cut string, err error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return st, 0, "", fmt.Errorf("ops: begin the marking transaction: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	// The first statement takes the snapshot: every row it sees
	// committed before this position.
	if err := tx.QueryRow(ctx, switchWALPositionSQL).Scan(&cut); err != nil {
		return st, 0, "", fmt.Errorf("ops: read the cut (the WAL insert position): %w", err)
	}
	if st, err = w.wait(ctx, cut, true); err != nil {
		return st, 0, cut, err
	}
	// Bounded by the switch's deadline too: the UPDATE may wait for row
	// locks (a park in progress).
	uctx, cancel := context.WithDeadline(ctx, w.deadline)
	defer cancel()
	tag, err := tx.Exec(uctx, render(switchMarkSQL, w.cfg.Tables))
	if err != nil {
		if uctx.Err() != nil && ctx.Err() == nil {
			return st, 0, cut, fmt.Errorf("%w: the marking UPDATE of %s waited for row locks past the timeout (%s); nothing was marked: run it again: %v", ErrSwitchTimeout, w.cfg.Tables.OutboxIdent(), w.cfg.Timeout, err)
		}
		return st, 0, cut, fmt.Errorf("ops: mark the rows of %s the slot confirmed dispatched: %w", w.cfg.Tables.OutboxIdent(), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return st, 0, cut, fmt.Errorf("ops: commit the marking transaction: %w", err)
	}
	return st, tag.RowsAffected(), cut, nil
}

// lockCleanup takes the outbox's cleanup lock, waiting for a running
// cleanup to finish (within the deadline).
func (w *slotWaiter) lockCleanup(ctx context.Context) (*pgxpool.Conn, func(), error) {
	for {
		conn, unlock, locked, err := cleanuplock.TryLock(ctx, w.pool, w.cfg.Tables)
		if err != nil || locked {
			return conn, unlock, err
		}
		if time.Now().After(w.deadline) {
			return nil, nil, fmt.Errorf("%w: a retention cleanup of %s held its lock for the whole %s; nothing was marked: run the switch again once it is done", ErrSwitchTimeout, w.cfg.Tables.OutboxIdent(), w.cfg.Timeout)
		}
		if !backoff.Sleep(ctx, 200*time.Millisecond) {
			return nil, nil, ctx.Err()
		}
	}
}

// wait returns once the slot has confirmed target, failing when it is
// gone or lost, when no WAL relayer reads it for ReaderGrace, and at the
// deadline. It writes a heartbeat message about every second, so that the
// relayer has something past target to confirm.
func (w *slotWaiter) wait(ctx context.Context, target string, inTx bool) (slotState, error) {
	slot := w.cfg.Slot
	var noReaderSince, nudged, reported time.Time
	for {
		st, found, err := readSlotState(ctx, w.pool, slot, target)
		if err != nil {
			return st, err
		}
		now := time.Now()
		switch {
		case !found:
			return st, fmt.Errorf("%w: no replication slot %s in this database, so no WAL source whose published events to mark; if you dropped it already (outbox relay --mode wal --teardown), a polling relayer would publish every row with dispatched_at NULL again; name the slot with --slot if it is not the default", ErrNoSlot, slot)
		case st.walStatus == "lost":
			return st, fmt.Errorf("%w: slot %s has wal_status=lost: events after %s may never have been published; nothing was marked: republish from the table with the polling relay (outbox relay), then drop the slot (outbox relay --mode wal --teardown)", walrelay.ErrSlotLost, slot, st.confirmed)
		case st.passed && st.streamedByRelayer():
			return st, nil
		case st.active && !st.streamedByRelayer() && !st.startingRelayer():
			return st, fmt.Errorf("%w: slot %s is read by pid %d (%q), not by a WAL relayer (outbox relay --mode wal), so its position does not say what the broker has; nothing was marked: stop that reader and start the WAL relay", ErrSlotNotStreamed, slot, st.pid, st.app)
		case !st.active && noReaderSince.IsZero():
			noReaderSince = now
		case st.active:
			noReaderSince = time.Time{}
		}
		if !noReaderSince.IsZero() && now.Sub(noReaderSince) >= w.cfg.ReaderGrace {
			return st, fmt.Errorf("%w: no process has read slot %s for %s, so it would never confirm the cut; nothing was marked: run the switch while the WAL relay (outbox relay --mode wal) runs", ErrSlotNotStreamed, slot, w.cfg.ReaderGrace)
		}
		if now.After(w.deadline) {
			return st, fmt.Errorf("%w: slot %s did not confirm WAL position %s within %s (it is at %s): is the WAL relayer (pid %d) reaching the broker? (its logs; 'outbox stats' shows the slot's lag); nothing was marked", ErrSwitchTimeout, slot, target, w.cfg.Timeout, st.confirmed, st.pid)
		}
		if now.Sub(nudged) >= time.Second {
			// Best effort: without it the relayer's own heartbeat
			// moves the slot, only later.
			_, _ = w.pool.Exec(ctx, switchNudgeSQL)
			nudged = now
		}
		if w.cfg.Progress != nil && now.Sub(reported) >= w.cfg.ProgressInterval {
			if !reported.IsZero() {
				pid := st.pid
				if !st.active {
					pid = 0
				}
				w.cfg.Progress(ConfirmProgress{InTransaction: inTx, Target: target, Confirmed: st.confirmed, ReaderPID: pid, Elapsed: now.Sub(w.start)})
			}
			reported = now
		}
		if !backoff.Sleep(ctx, w.cfg.PollInterval) {
			return st, ctx.Err()
		}
	}
}

// slotState is a slot and its reader, as a switch sees them.
type slotState struct {
	walStatus string
	active    bool
	pid       int32
	app       string // the reader's application_name
	confirmed string // confirmed_flush_lsn; 0/0 while it is being created
	passed    bool   // confirmed_flush_lsn >= the position asked about
}

func (s slotState) streamedByRelayer() bool {
	return s.active && strings.HasPrefix(s.app, walStreamAppName)
}

// walLeaderAppName starts the application_name of a WAL relayer's leader
// session, which holds the slot while it creates it (creating a logical
// slot waits for the transactions open at that moment to end).
const walLeaderAppName = "outbox-wal leader"

// startingRelayer reports a slot held by a WAL relayer that is about to
// stream it: its leader session, creating the slot.
func (s slotState) startingRelayer() bool {
	return s.active && strings.HasPrefix(s.app, walLeaderAppName)
}

// readSlotState reads slot; target, when not empty, is a WAL position to
// compare its confirmed position with.
func readSlotState(ctx context.Context, db outbox.DB, slot, target string) (slotState, bool, error) {
	var s slotState
	var lsn *string
	if target != "" {
		lsn = &target
	}
	err := db.QueryRow(ctx, switchSlotSQL, slot, lsn).Scan(&s.walStatus, &s.active, &s.pid, &s.app, &s.confirmed, &s.passed)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("ops: read replication slot %s: %w", slot, err)
	}
	return s, true, nil
}
