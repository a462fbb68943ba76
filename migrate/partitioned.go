package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// The partitioned layout is, like binary payloads, a setting of one outbox
// table and not a numbered migration: the table is range-partitioned on
// id, its old partitions are detached and dropped by retention instead of
// deleted row by row (ops.Cleanup), and new ones are made ahead of the id
// sequence (ops.EnsurePartitions). Everything else is the plain layout's:
// the columns, the primary key on id (a partitioned index, unique across
// partitions because id is the partition key), the pending index per
// partition, the insert guard, the SQL emit functions, NOTIFY, the
// failures and parked tables, binary payloads. docs/partitioning.md says
// why id and how wide.
//
// The partitioned table replaces an empty plain one, in one transaction:
// it is made beside it (CreatePartitionedTable), the plain table dropped,
// the new one renamed into its place, with the id sequence, so producers
// see no change. Moving a table that holds rows is another matter (a copy
// under way while producers write).
//
// Version 999999 is the row the migrations table holds while the outbox is
// partitioned, below binary payloads' 1000000 and so counted as a version
// by every binary from before this layout: they refuse the table as newer
// than they are, instead of relaying or cleaning an outbox whose
// partitions they would never make or drop (inserts would fail once the
// last partition filled). currentSQL and appliedSQL skip it.

// Layout is how an outbox table is laid out.
type Layout int

const (
	// LayoutPlain is one table (the migrations' layout, the default).
	LayoutPlain Layout = iota
	// LayoutPartitioned is a table range-partitioned on id.
	LayoutPartitioned
)

func (l Layout) String() string {
	if l == LayoutPartitioned {
		return "partitioned"
	}
	return "plain"
}

// Partition settings' defaults and bounds.
const (
	// DefaultPartitionWidth is 100 million ids a partition: a day and a
	// bit at 1,000 events/s, so that a week's retention keeps about ten
	// partitions (the claim's planning grows with their number; see
	// docs/partitioning.md for the measurements).
	DefaultPartitionWidth int64 = 100_000_000
	// DefaultPartitionAhead keeps three days of ids in partitions ahead of
	// the sequence at the recent rate: an insert never waits for the job
	// that makes them, even over a long weekend without it.
	DefaultPartitionAhead = 72 * time.Hour
	// MinPartitionWidth is the narrowest partition taken.
	MinPartitionWidth int64 = 10
)

// PartitionSettings are a partitioned outbox's settings, recorded in the
// database (<outbox>_partitioning) so that every process that makes or
// drops partitions agrees.
type PartitionSettings struct {
	// Width is how many ids one partition holds. Partitions made from now
	// on take it; existing ones keep their bounds. Defaults to
	// DefaultPartitionWidth (100,000,000).
	Width int64
	// Ahead is how long the partitions ahead of the id sequence last at the
	// ids drawn per second over the last hour (never fewer than two
	// partitions' worth). Defaults to DefaultPartitionAhead (72h).
	Ahead time.Duration
}

// WithDefaults returns s with its zero fields set to their defaults.
func (s PartitionSettings) WithDefaults() PartitionSettings {
	if s.Width == 0 {
		s.Width = DefaultPartitionWidth
	}
	if s.Ahead == 0 {
		s.Ahead = DefaultPartitionAhead
	}
	return s
}

// Validate refuses a width under MinPartitionWidth or a negative Ahead.
func (s PartitionSettings) Validate() error {
	if s.Width < MinPartitionWidth && s.Width != 0 {
		return fmt.Errorf("migrate: partition width %d is under %d ids; pick one partition's worth of events (a day's, say)", s.Width, MinPartitionWidth)
	}
	if s.Ahead < 0 {
		return fmt.Errorf("migrate: partitions ahead %s is negative; give how long the partitions made ahead should last, e.g. 72h", s.Ahead)
	}
	return nil
}

// Partitioning is an outbox table's layout as the database records it.
type Partitioning struct {
	Layout Layout
	// Settings are the partitioned layout's (zero for a plain table).
	Settings PartitionSettings
	// Detaching is the partition a retention run began to detach or drop
	// and has not finished with (its process died): the next run finishes
	// it. Zero when none.
	Detaching DetachIntent
}

// DetachIntent is a partition retention is detaching or dropping: its
// table (unquoted, in the outbox's schema) and bounds.
type DetachIntent struct {
	Name     string
	From, To int64
}

// ReadPartitioning reads the layout of the outbox table of tables, and for
// a partitioned one its settings: what ops reads to choose between
// dropping partitions and deleting rows.
func ReadPartitioning(ctx context.Context, db outbox.DB, tables outbox.Tables) (Partitioning, error) {
	tables = tables.WithDefaults()
	ids := sqltext.For(tables.Schema, tables.Outbox, tables.Processed)
	var p Partitioning
	var partitioned bool
	if err := db.QueryRow(ctx, layoutSQL, ids.Outbox).Scan(&partitioned); err != nil {
		return p, fmt.Errorf("migrate: read the layout of %s: %w", ids.Outbox, err)
	}
	if !partitioned {
		return p, nil
	}
	p.Layout = LayoutPartitioned
	var err error
	p.Settings, p.Detaching, err = readPartitionSettings(ctx, db, ids)
	return p, err
}

// ReadPartitionSettings reads the partitioned layout's settings of the
// outbox of tables, recorded by EnablePartitioned or
// CreatePartitionedTable, whatever the outbox table's layout: while an
// outbox is moved into the layout, its partitioned twin has them and the
// outbox table is still plain.
func ReadPartitionSettings(ctx context.Context, db outbox.DB, tables outbox.Tables) (PartitionSettings, error) {
	tables = tables.WithDefaults()
	s, _, err := readPartitionSettings(ctx, db, sqltext.For(tables.Schema, tables.Outbox, tables.Processed))
	return s, err
}

func readPartitionSettings(ctx context.Context, db outbox.DB, ids sqltext.Idents) (PartitionSettings, DetachIntent, error) {
	var s PartitionSettings
	var in DetachIntent
	var aheadUS int64
	var name *string
	var from, to *int64
	err := db.QueryRow(ctx, sqltext.Render(partitionSettingsSQL, ids)).Scan(&s.Width, &aheadUS, &name, &from, &to)
	if err != nil {
		return s, in, fmt.Errorf("migrate: the partitioned layout's settings of %s (%s) cannot be read: %w (run `outbox migrate up --partitioned`)", ids.Outbox, ids.Partitioning, err)
	}
	s.Ahead = time.Duration(aheadUS) * time.Microsecond
	if name != nil && from != nil && to != nil {
		in = DetachIntent{Name: *name, From: *from, To: *to}
	}
	return s, in, nil
}

// Partitioning reads the layout of m's outbox table (ReadPartitioning).
func (m *Migrator) Partitioning(ctx context.Context, db outbox.DB) (Partitioning, error) {
	return ReadPartitioning(ctx, db, m.tables)
}

// ErrNotEmpty: the partitioned layout replaces only an empty outbox table.
var ErrNotEmpty = errors.New("migrate: the outbox table holds rows")

// EnablePartitioned applies every pending migration (Up), then makes m's
// outbox table partitioned, with settings s (defaults for zero fields),
// and returns the versions Up applied. The table must be empty (a fresh
// install: ErrNotEmpty otherwise) and in no publication; its replacement
// keeps its name, columns, id sequence, triggers, grants and comments, and
// gets partitions for two widths of ids from the sequence's next value
// (ops.EnsurePartitions, which the relay runs, keeps more ahead). On a
// partitioned table it updates the settings to s's non-zero fields. What
// `outbox migrate up --partitioned` runs.
func (m *Migrator) EnablePartitioned(ctx context.Context, db outbox.DB, s PartitionSettings) ([]int, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	applied, err := m.Up(ctx, db)
	if err != nil {
		return applied, err
	}
	err = retryLocked(ctx, func() error {
		return m.inTx(ctx, db, true, func(tx pgx.Tx) error {
			if err := m.validateIn(ctx, tx); err != nil {
				return err
			}
			p, err := ReadPartitioning(ctx, tx, m.tables)
			if err != nil {
				return err
			}
			if p.Layout == LayoutPartitioned {
				return m.updatePartitionSettings(ctx, tx, p.Settings, s)
			}
			return m.partition(ctx, tx, s.WithDefaults())
		})
	})
	if err != nil {
		return applied, fmt.Errorf("migrate: partition %s: %w", m.tables.OutboxIdent(), err)
	}
	return applied, nil
}

// partition replaces the plain, empty outbox table with a partitioned one
// in tx, which holds the migration lock.
func (m *Migrator) partition(ctx context.Context, tx pgx.Tx, s PartitionSettings) error {
	if _, err := tx.Exec(ctx, binaryLockTimeoutSQL, binaryLockTimeout); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqltext.Render(lockOutboxSQL, m.ids)); err != nil {
		return err
	}
	var next int64
	if err := tx.QueryRow(ctx, sqltext.Render(nextIDSQL, m.ids)).Scan(&next); err != nil {
		return fmt.Errorf("read the id sequence %s: %w", m.ids.IDSeq, err)
	}
	for _, stmt := range m.partitionScript(s, next) {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			if r := refusal(err); r != nil {
				return r
			}
			return err
		}
	}
	return nil
}

// partitionScript is the SQL that replaces the plain, empty outbox table
// with a partitioned one whose partitions cover the ids from next on for
// two widths: what partition runs and `outbox migrate print --partitioned`
// prints. Its first statement refuses a table that holds rows, is
// published, or whose sequence is past next.
func (m *Migrator) partitionScript(s PartitionSettings, next int64) []string {
	from := next / s.Width * s.Width
	to := from + 2*s.Width
	for to-next < 2*s.Width {
		to += s.Width
	}
	tmp := m.trimmed("_partitioned")
	stmts := []string{
		fmt.Sprintf(sqltext.Render(partitionRefuseSQL, m.ids), to-s.Width),
	}
	stmts = append(stmts, m.createPartitionedSQL(tmp, s)...)
	stmts = append(stmts,
		sqltext.Render(seqUnownSQL, m.ids),
		sqltext.Render(dropOutboxSQL, m.ids),
		fmt.Sprintf(renameTableSQL, pgident.Qualified(m.tables.Schema, tmp), pgident.Quote(m.tables.Outbox)),
		fmt.Sprintf(sqltext.Render(renamePKeySQL, m.ids), pgident.Quote(trim(tmp+"_pkey")), pgident.Quote(m.trimmed("_pkey"))),
		fmt.Sprintf(sqltext.Render(renamePendingSQL, m.ids), pgident.Qualified(m.tables.Schema, trim(tmp+"_pending_idx"))),
		sqltext.Render(seqOwnSQL, m.ids),
		sqltext.Render(partitionedMarkSQL, m.ids),
	)
	for lo := from; lo < to; lo += s.Width {
		part := pgident.Qualified(m.tables.Schema, partition.Name(m.tables.Outbox, lo))
		stmts = append(stmts, partition.Statements(m.ids.Outbox, part, lo, lo+s.Width)...)
	}
	return stmts
}

// CreatePartitionedTable creates, in tx, the table name (unquoted, in m's
// schema) as a partitioned twin of m's outbox table, without partitions:
// its columns, defaults (ids from the outbox's sequence), NOT NULLs, CHECK
// constraints and comments, a primary key on id (<name>_pkey), the pending
// index (id) WHERE dispatched_at IS NULL (<name>_pending_idx), the outbox
// table's triggers (the insert guard) with their comments, and its grants;
// and records the layout's settings s (defaults for zero fields) for the
// outbox. The guard function is made to name the root table of whichever
// table it fires on in its errors, as it names the plain table. The seam
// for moving an outbox that holds rows into the partitioned layout: create
// the twin, give it partitions from the oldest row's id on
// (ops.EnsurePartitions with Table and From), fill it, swap it in (rename,
// the id sequence's owner, the pending index's and primary key's names,
// and the layout's mark in the migrations table, as EnablePartitioned's
// script does for an empty table).
func (m *Migrator) CreatePartitionedTable(ctx context.Context, tx pgx.Tx, name string, s PartitionSettings) error {
	if err := pgident.Validate("partitioned table", name); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := s.Validate(); err != nil {
		return err
	}
	for _, stmt := range m.createPartitionedSQL(name, s.WithDefaults()) {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("migrate: create the partitioned table %s like %s: %w", name, m.ids.Outbox, err)
		}
	}
	return nil
}

// createPartitionedSQL is CreatePartitionedTable's SQL.
func (m *Migrator) createPartitionedSQL(name string, s PartitionSettings) []string {
	q := pgident.Qualified(m.tables.Schema, name)
	return []string{
		fmt.Sprintf(sqltext.Render(createPartitionedSQL, m.ids), q, pgident.Quote(trim(name+"_pkey"))),
		fmt.Sprintf(sqltext.Render(createPendingSQL, m.ids), pgident.Quote(trim(name+"_pending_idx")), q),
		fmt.Sprintf(sqltext.Render(copyTriggersSQL, m.ids), q),
		fmt.Sprintf(sqltext.Render(copyGrantsSQL, m.ids), q),
		sqltext.Render(guardRootSQL, m.ids),
		sqltext.Render(createPartitioningSQL, m.ids),
		fmt.Sprintf(sqltext.Render(insertPartitioningSQL, m.ids), s.Width, s.Ahead.Microseconds()),
	}
}

func (m *Migrator) updatePartitionSettings(ctx context.Context, tx pgx.Tx, cur, s PartitionSettings) error {
	if s.Width != 0 {
		cur.Width = s.Width
	}
	if s.Ahead != 0 {
		cur.Ahead = s.Ahead
	}
	// A migration applied since may have replaced the guard function.
	if _, err := tx.Exec(ctx, sqltext.Render(guardRootSQL, m.ids)); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(sqltext.Render(insertPartitioningSQL, m.ids), cur.Width, cur.Ahead.Microseconds()))
	return err
}

// dropPartitioning removes, in the transaction that reverts migration 1,
// what the partitioned layout adds beside the table: its settings, its
// mark, and a partition a retention run detached and had not yet dropped.
func (m *Migrator) dropPartitioning(ctx context.Context, tx pgx.Tx) error {
	p, err := ReadPartitioning(ctx, tx, m.tables)
	if err != nil || p.Layout != LayoutPartitioned {
		return err
	}
	if p.Detaching.Name != "" {
		if _, err := tx.Exec(ctx, fmt.Sprintf(dropDetachedSQL, pgident.Qualified(m.tables.Schema, p.Detaching.Name))); err != nil {
			return err
		}
	}
	for _, stmt := range []string{dropPartitioningSQL, partitionedUnmarkSQL} {
		if _, err := tx.Exec(ctx, sqltext.Render(stmt, m.ids)); err != nil {
			return err
		}
	}
	return nil
}

// trimmed is the outbox table's name with suffix, cut to Postgres'
// identifier length.
func (m *Migrator) trimmed(suffix string) string { return trim(m.tables.Outbox + suffix) }

func trim(s string) string {
	if len(s) > pgident.MaxLen {
		return s[:pgident.MaxLen]
	}
	return s
}

// refusal is partitionRefuseSQL's refusal (SQLSTATE P0001,
// raise_exception) as an error of its own, ErrNotEmpty when the table
// holds rows; nil for any other error.
func refusal(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "P0001" {
		return nil
	}
	if strings.Contains(pgErr.Message, "holds rows") {
		return fmt.Errorf("%w: %s", ErrNotEmpty, pgErr.Message)
	}
	return errors.New(pgErr.Message)
}

// retryLocked runs fn until it succeeds, fails other than by a lock
// timeout, or has been tried binaryAttempts times.
func retryLocked(ctx context.Context, fn func() error) error {
	return partition.RetryLocked(ctx, binaryAttempts, fn)
}
