package migrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// Moving an outbox that holds rows between the layouts, online: producers
// keep writing, relayers of either source keep running.
//
// Convert (plain to partitioned) copies no row: the plain table becomes
// the first partition, [0, bound), of a partitioned table that takes its
// name. Three steps, each its own transaction, recorded in
// <outbox>_layout_move:
//
//  1. bound: a CHECK (id >= 0 AND id < bound) NOT VALID on the plain
//     table, bound two widths (MoveConfig.Headroom) past the sequence,
//     rounded up to a width: ACCESS EXCLUSIVE for an instant, no scan.
//  2. validate: one scan proves the CHECK, under SHARE UPDATE EXCLUSIVE,
//     which lets inserts, claims and deletes go on.
//  3. swap: one short transaction under ACCESS EXCLUSIVE (it waits for
//     the claims and inserts in flight, for at most 2s, and is retried):
//     the partitioned twin is made beside it, the plain table renamed to
//     its partition's name and attached (the valid CHECK spares the scan,
//     its primary key and pending index are attached, not built), the
//     twin renamed into its place with the id sequence, partitions made
//     from the bound on, the layout recorded.
//
// An insert at or past the bound fails while the CHECK holds and the
// swap has not run: before each step the sequence is compared with the
// bound, and a bound the sequence came within a quarter of the headroom
// of is taken off and set again higher (another scan).
//
// Revert (partitioned to plain) is one short transaction under ACCESS
// EXCLUSIVE: a plain twin is made, the pending rows are copied into it
// with their ids, the partitioned table is renamed <outbox>_retired and
// the twin takes its name, sequence, triggers and grants. Cleanup drops
// the retired table once the retention has passed (DropRetired).
//
// Both carry the outbox's publications (the WAL source's) to the new
// table in the swap's transaction (republishSQL): pgoutput decodes each
// change with the catalog as of its commit, so inserts committed before
// the swap come as the old table's, those after it as the new one's (a
// partition's as the partitioned table's: publish_via_partition_root),
// each once, whether the slot streams across the swap or is created
// while it runs. A revert's copy goes into the twin before it is
// published, so the WAL source does not send those rows again.
//
// Names resolve again after DDL: producers' and relayers' prepared
// statements and the SQL functions reach the new table by its name on
// their next run (checked on Postgres 15).

// Move directions and the steps recorded.
const (
	MoveConvert = "convert"
	MoveRevert  = "revert"

	StepBound    = "bound"    // convert: the CHECK is added, not yet validated
	StepValidate = "validate" // convert: the CHECK is being (or was) validated
	StepSwap     = "swap"     // the swap's transaction
	StepDone     = "done"
)

// MoveConfig configures Convert and Revert.
type MoveConfig struct {
	// Settings are the partitioned layout's (Convert). Zero fields take
	// their defaults.
	Settings PartitionSettings
	// Headroom is how many ids Convert leaves between the sequence and the
	// old table's bound: inserts fail if the sequence reaches the bound
	// before the swap, so it must outlast the validation scan at the
	// producers' rate. Defaults to two partition widths.
	Headroom int64
	// MaxCopy is the most pending rows Revert copies under its lock; more
	// and it refuses (drain the backlog first). Defaults to 100,000.
	MaxCopy int64
	// Logger receives a line per step. Defaults to slog.Default().
	Logger *slog.Logger
	// BeforeStep, when set, is called before each step with its name,
	// and inside the swap's transaction, its table locked, with
	// "swap-locked": a seam for tests that stop the move there.
	BeforeStep func(step string)
}

func (c MoveConfig) withDefaults() MoveConfig {
	c.Settings = c.Settings.WithDefaults()
	if c.Headroom == 0 {
		c.Headroom = 2 * c.Settings.Width
	}
	if c.MaxCopy == 0 {
		c.MaxCopy = 100_000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.BeforeStep == nil {
		c.BeforeStep = func(string) {}
	}
	return c
}

// MoveState is the record of the last move of an outbox table.
type MoveState struct {
	Direction string    `json:"direction"`
	Step      string    `json:"step"`
	Bound     int64     `json:"bound,omitempty"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Finished is zero while the move is under way (or was interrupted:
	// run it again).
	Finished time.Time `json:"finished_at,omitzero"`
	// Retired is the table a revert left, dropped by cleanup once the
	// retention has passed since RetiredAt; empty when none.
	Retired   string    `json:"retired,omitempty"`
	RetiredAt time.Time `json:"retired_at,omitzero"`
}

// MoveResult is what a Convert or Revert did.
type MoveResult struct {
	// Done lists the steps this run carried out, in order.
	Done []string
	// Copied is how many pending rows Revert copied.
	Copied int64
	// State is the move's record afterwards.
	State MoveState
}

// ErrMoveRefused: the move cannot run on the table as it is; the error
// says why and what to do.
var ErrMoveRefused = errors.New("migrate: the move cannot run")

// ReadMove reads the record of the last move of m's outbox table; found
// is false when none was ever begun.
func (m *Migrator) ReadMove(ctx context.Context, db outbox.DB) (st MoveState, found bool, err error) {
	if err := db.QueryRow(ctx, moveExistsSQL, m.ids.LayoutMove).Scan(&found); err != nil || !found {
		return st, false, err
	}
	var bound *int64
	var retired *string
	var retiredAt, finished *time.Time
	err = db.QueryRow(ctx, sqltext.Render(readMoveSQL, m.ids)).Scan(&st.Direction, &st.Step, &bound, &retired, &retiredAt, &st.StartedAt, &st.UpdatedAt, &finished)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("migrate: read %s: %w", m.ids.LayoutMove, err)
	}
	if bound != nil {
		st.Bound = *bound
	}
	if retired != nil {
		st.Retired = *retired
	}
	if retiredAt != nil {
		st.RetiredAt = *retiredAt
	}
	if finished != nil {
		st.Finished = *finished
	}
	return st, true, nil
}

// tableState is what a move reads of the outbox table before each step.
type tableState struct {
	kind               string // "r" plain, "p" partitioned
	bounded, validated bool   // the bounds CHECK exists, is validated
	next               int64  // the id the sequence hands out next
	move               MoveState
	moving             bool // a move's record exists
}

func (m *Migrator) readTableState(ctx context.Context, db outbox.DB) (tableState, error) {
	var s tableState
	if err := db.QueryRow(ctx, boundStateSQL, m.ids.Outbox).Scan(&s.kind, &s.bounded, &s.validated); err != nil {
		return s, fmt.Errorf("migrate: read %s: %w", m.ids.Outbox, err)
	}
	if err := db.QueryRow(ctx, sqltext.Render(nextIDSQL, m.ids)).Scan(&s.next); err != nil {
		return s, fmt.Errorf("migrate: read the id sequence %s: %w", m.ids.IDSeq, err)
	}
	var err error
	s.move, s.moving, err = m.ReadMove(ctx, db)
	return s, err
}

// Convert moves m's plain outbox table, holding rows or not, into the
// partitioned layout while producers and relayers run (see the comment at
// the top of move.go). It is resumable: run again after an interruption
// (a kill at any point) it reads where the table stands and goes on. On
// a table already partitioned it finishes the record and does nothing.
func (m *Migrator) Convert(ctx context.Context, db outbox.DB, cfg MoveConfig) (MoveResult, error) {
	var res MoveResult
	if err := cfg.Settings.Validate(); err != nil {
		return res, err
	}
	cfg = cfg.withDefaults()
	if err := m.Validate(ctx, db); err != nil {
		return res, err
	}
	for range 16 {
		s, err := m.readTableState(ctx, db)
		if err != nil {
			return res, err
		}
		step, err := m.convertStep(ctx, db, cfg, s)
		if err != nil {
			return res, fmt.Errorf("migrate: convert %s (step %s): %w", m.ids.Outbox, step, err)
		}
		if step == StepDone {
			res.State, _, err = m.ReadMove(ctx, db)
			return res, err
		}
		res.Done = append(res.Done, step)
	}
	return res, fmt.Errorf("migrate: convert %s: the sequence keeps reaching the bound before the swap; raise the headroom", m.ids.Outbox)
}

// convertStep carries out the next step of a conversion from s, and
// returns its name (StepDone when there is none left).
func (m *Migrator) convertStep(ctx context.Context, db outbox.DB, cfg MoveConfig, s tableState) (string, error) {
	log := cfg.Logger.With("outbox", m.tables.OutboxIdent())
	switch {
	case s.kind == "p":
		if s.moving && s.move.Direction == MoveConvert && s.move.Finished.IsZero() {
			return StepDone, m.setStep(ctx, db, StepDone, true)
		}
		return StepDone, nil
	case s.kind != "r":
		return "", fmt.Errorf("%w: %s is neither a table nor a partitioned table (relkind %q)", ErrMoveRefused, m.ids.Outbox, s.kind)
	case !s.bounded:
		return StepBound, m.addBound(ctx, db, cfg, s, log)
	case !s.moving || s.move.Bound == 0:
		return "", fmt.Errorf("%w: %s has a constraint partition_bounds that no move recorded: drop it (ALTER TABLE %s DROP CONSTRAINT partition_bounds) if it is your own, and run again", ErrMoveRefused, m.ids.Outbox, m.ids.Outbox)
	case s.move.Bound-s.next < cfg.Headroom/4:
		log.Warn("the id sequence came close to the bound before the swap: setting a higher one (another validation scan)", "bound", s.move.Bound, "next_id", s.next)
		return StepBound, m.inLocked(ctx, db, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sqltext.Render(dropBoundSQL, m.ids))
			return err
		})
	case !s.validated:
		cfg.BeforeStep(StepValidate)
		log.Info("validating the bound: one scan of the table; producers and relayers go on", "bound", s.move.Bound)
		return StepValidate, m.inLocked(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqltext.Render(validateBoundSQL, m.ids)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sqltext.Render(stepMoveSQL, m.ids), StepSwap, false)
			return err
		})
	}
	cfg.BeforeStep(StepSwap)
	log.Info("swapping in the partitioned table", "bound", s.move.Bound)
	return StepSwap, m.swapPartitioned(ctx, db, cfg, s.move.Bound)
}

// inLocked runs fn in a transaction under the migration lock whose
// statements wait at most binaryLockTimeout for a lock, retried.
func (m *Migrator) inLocked(ctx context.Context, db outbox.DB, fn func(pgx.Tx) error) error {
	return retryLocked(ctx, func() error {
		return m.inTx(ctx, db, true, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, binaryLockTimeoutSQL, binaryLockTimeout); err != nil {
				return err
			}
			return fn(tx)
		})
	})
}

// addBound adds the bounds CHECK and records the move, in one transaction.
func (m *Migrator) addBound(ctx context.Context, db outbox.DB, cfg MoveConfig, s tableState, log *slog.Logger) error {
	if err := m.refuseLeftovers(ctx, db); err != nil {
		return err
	}
	w := cfg.Settings.Width
	bound := ((s.next+cfg.Headroom)/w + 1) * w
	cfg.BeforeStep(StepBound)
	log.Info("adding the bound the old table's rows stay under", "bound", bound, "next_id", s.next)
	return m.inLocked(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqltext.Render(createMoveSQL, m.ids)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(sqltext.Render(addBoundSQL, m.ids), bound)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqltext.Render(beginMoveSQL, m.ids), MoveConvert, StepValidate, bound)
		return err
	})
}

// refuseLeftovers refuses a conversion while a table a revert retired is
// still there: its partitions hold the names the new ones take.
func (m *Migrator) refuseLeftovers(ctx context.Context, db outbox.DB) error {
	st, found, err := m.ReadMove(ctx, db)
	if err != nil || !found || st.Retired == "" {
		return err
	}
	return fmt.Errorf("%w: %s still holds the table %s that a revert retired on %s; cleanup drops it once the retention has passed, or drop it yourself (DROP TABLE %s) once nothing in it is needed, then run again",
		ErrMoveRefused, m.ids.Outbox, st.Retired, st.RetiredAt.Format(time.RFC3339), pgident.Qualified(m.tables.Schema, st.Retired))
}

func (m *Migrator) setStep(ctx context.Context, db outbox.DB, step string, finished bool) error {
	_, err := db.Exec(ctx, sqltext.Render(stepMoveSQL, m.ids), step, finished)
	return err
}

// swapPartitioned is the conversion's swap, one transaction.
func (m *Migrator) swapPartitioned(ctx context.Context, db outbox.DB, cfg MoveConfig, bound int64) error {
	return m.inLocked(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqltext.Render(lockOutboxSQL, m.ids)); err != nil {
			return err
		}
		s, err := m.readTableState(ctx, tx)
		if err != nil {
			return err
		}
		if s.kind != "r" || !s.validated || s.move.Bound != bound {
			return fmt.Errorf("the table changed under the move (kind %s, bound validated %v, bound %d): run again", s.kind, s.validated, s.move.Bound)
		}
		var pkey string
		if err := tx.QueryRow(ctx, pkeyNameSQL, m.ids.Outbox).Scan(&pkey); err != nil {
			return fmt.Errorf("read the primary key of %s: %w", m.ids.Outbox, err)
		}
		for _, stmt := range m.convertScript(pkey, bound, s.next, cfg.Settings) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%w (in: %.120s)", err, stmt)
			}
		}
		if _, err := tx.Exec(ctx, sqltext.Render(stepMoveSQL, m.ids), StepDone, true); err != nil {
			return err
		}
		cfg.BeforeStep("swap-locked")
		return nil
	})
}

// convertScript is the swap's SQL: the plain table (primary key pkey)
// becomes the partition [0, bound) of a partitioned table that takes its
// name; partitions follow from bound for two widths past next.
func (m *Migrator) convertScript(pkey string, bound, next int64, s PartitionSettings) []string {
	schema := m.tables.Schema
	part := partition.Name(m.tables.Outbox, 0)
	partQ := pgident.Qualified(schema, part)
	tmp := m.trimmed("_partitioned")
	stmts := m.createPartitionedSQL(tmp, s) // with the layout's settings
	stmts = append(stmts,
		fmt.Sprintf(twinUnboundSQL, pgident.Qualified(schema, tmp)),
		sqltext.Render(dropTriggersSQL, m.ids),
		fmt.Sprintf(sqltext.Render(renameConstraintSQL, m.ids), pgident.Quote(pkey), pgident.Quote(trim(part+"_pkey"))),
		fmt.Sprintf(renameIndexSQL, pgident.Qualified(schema, m.trimmed("_pending_idx")), pgident.Quote(trim(part+"_pending_idx"))),
		fmt.Sprintf(sqltext.Render(renameOutboxSQL, m.ids), pgident.Quote(part)),
		fmt.Sprintf(renameTableSQL, pgident.Qualified(schema, tmp), pgident.Quote(m.tables.Outbox)),
		fmt.Sprintf(sqltext.Render(renamePKeySQL, m.ids), pgident.Quote(trim(tmp+"_pkey")), pgident.Quote(m.trimmed("_pkey"))),
		fmt.Sprintf(sqltext.Render(renamePendingSQL, m.ids), pgident.Qualified(schema, trim(tmp+"_pending_idx"))),
		sqltext.Render(seqOwnSQL, m.ids),
		fmt.Sprintf(sqltext.Render(attachOldSQL, m.ids), partQ, bound),
		sqltext.Render(partitionedMarkSQL, m.ids),
	)
	top := bound + 2*s.Width
	for top-next < 2*s.Width {
		top += s.Width
	}
	for lo := bound; lo < top; lo += s.Width {
		stmts = append(stmts, partition.Statements(m.ids.Outbox, pgident.Qualified(schema, partition.Name(m.tables.Outbox, lo)), lo, lo+s.Width)...)
	}
	return append(stmts, fmt.Sprintf(sqltext.Render(republishSQL, m.ids), partQ, "true"))
}
