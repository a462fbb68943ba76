// Package partition reads and changes the partitions of a range-partitioned
// outbox table (migrate.Migrator.EnablePartitioned): the catalog's view of
// them (bounds, an unfinished detach), and the DDL that adds, detaches,
// attaches and drops one. Package migrate creates the partitioned table;
// package ops keeps partitions ahead of the id sequence and drops old ones.
//
// A partition holds the ids From <= id < To. It is named after the outbox
// and its lower bound, <outbox>_p<From as 19 digits>, so that names sort as
// the ranges do; the outbox name is at most 41 bytes (outbox.Tables), so
// the name fits Postgres' 63.
package partition

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/lockkey"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// Partition is one range partition of a partitioned outbox table.
type Partition struct {
	// Name is the partition's table, unquoted, in the outbox's schema.
	Name string
	// From and To bound the ids it holds: From <= id < To.
	From, To int64
	// DetachPending is set while a DETACH PARTITION ... CONCURRENTLY that
	// did not finish (its session died) holds it half detached: queries
	// of the outbox no longer see it, and no other partition can be
	// detached concurrently until it is finished (FINALIZE).
	DetachPending bool
	// Rows is Postgres' estimate of its rows (pg_class.reltuples): -1
	// until it was first vacuumed or analyzed.
	Rows int64
}

// Name is the name of the partition of the outbox table outboxTable whose
// lower bound is from (from >= 0: ids come from a sequence starting at 1).
func Name(outboxTable string, from int64) string {
	return fmt.Sprintf("%s_p%019d", outboxTable, from)
}

// bound parses pg_get_expr of a partition's relpartbound. Bounds are
// quoted by Postgres ('100'); MINVALUE, MAXVALUE and DEFAULT are not
// numbers, and outbox never makes such a partition.
var bound = regexp.MustCompile(`^FOR VALUES FROM \('?(-?[0-9]+)'?\) TO \('?(-?[0-9]+)'?\)$`)

// ErrUnmanaged is returned (wrapped, naming it) when the outbox table has a
// partition outbox did not make: a DEFAULT partition (it keeps DETACH
// CONCURRENTLY from running at all) or a range open at either end.
var ErrUnmanaged = errors.New("partition: the outbox table has a partition outbox does not manage")

// List reads the partitions of the partitioned table parent (quoted and
// qualified), in the order of their ranges.
func List(ctx context.Context, db outbox.DB, parent string) ([]Partition, error) {
	rows, err := db.Query(ctx, listSQL, parent)
	if err != nil {
		return nil, fmt.Errorf("partition: read the partitions of %s: %w", parent, err)
	}
	var out []Partition
	var name, expr string
	var p Partition
	_, err = pgx.ForEachRow(rows, []any{&name, &expr, &p.DetachPending, &p.Rows}, func() error {
		m := bound.FindStringSubmatch(expr)
		if m == nil {
			return fmt.Errorf("%w: %s is %s; outbox keeps ranges of ids with numbers at both ends, and a DEFAULT partition blocks DETACH CONCURRENTLY: detach and drop it (ALTER TABLE %s DETACH PARTITION ...)", ErrUnmanaged, name, expr, parent)
		}
		p.Name = name
		p.From, _ = strconv.ParseInt(m[1], 10, 64)
		p.To, _ = strconv.ParseInt(m[2], 10, 64)
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("partition: read the partitions of %s: %w", parent, err)
	}
	slices.SortFunc(out, func(a, b Partition) int { return cmp.Compare(a.From, b.From) })
	return out, nil
}

// IsPartitioned reports whether the table (quoted and qualified) is a
// partitioned table.
func IsPartitioned(ctx context.Context, db outbox.DB, table string) (bool, error) {
	var partitioned bool
	if err := db.QueryRow(ctx, partitionedSQL, table).Scan(&partitioned); err != nil {
		return false, fmt.Errorf("partition: read the layout of %s: %w", table, err)
	}
	return partitioned, nil
}

// lockTimeout bounds how long one DDL statement here waits for its lock,
// and attempts how often it is tried: a statement queued behind a long
// transaction would queue the producers and relayers behind it.
const (
	lockTimeout = "2s"
	attempts    = 10
)

// Add creates the partition [from, to) of the partitioned table parent
// (unquoted, in t's schema) and reports whether it did: not when a
// partition with those bounds exists already (another process made it).
// The partition is made as a table of its own, shaped like parent, and
// then attached: ATTACH PARTITION takes SHARE UPDATE EXCLUSIVE on parent,
// which lets inserts, claims and cleanup go on, where CREATE TABLE ...
// PARTITION OF would take ACCESS EXCLUSIVE. Its CHECK on the bounds spares
// the attach a scan, and stays: a later DETACH CONCURRENTLY finds it and
// adds none of its own, and a re-attach needs no scan either. The whole is
// one transaction under the migration lock, so concurrent Adds and
// migrations serialise and a failed Add leaves nothing behind.
func Add(ctx context.Context, db outbox.DB, t outbox.Tables, parent string, from, to int64) (created bool, err error) {
	t = t.WithDefaults()
	parentQ := pgident.Qualified(t.Schema, parent)
	name := Name(t.Outbox, from)
	partQ := pgident.Qualified(t.Schema, name)
	err = retry(ctx, func() error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, migrationLockSQL, lockkey.Migration(t.Schema, t.Outbox)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, lockTimeoutSQL, lockTimeout); err != nil {
				return err
			}
			ps, err := List(ctx, tx, parentQ)
			if err != nil {
				return err
			}
			for _, p := range ps {
				if p.From == from && p.To == to {
					created = false
					return nil
				}
				if p.From < to && from < p.To {
					return fmt.Errorf("partition: ids %d to %d overlap partition %s (%d to %d) of %s", from, to-1, p.Name, p.From, p.To-1, parentQ)
				}
			}
			created = true
			return create(ctx, tx, parentQ, partQ, from, to)
		})
	})
	if err != nil {
		return false, fmt.Errorf("partition: add %s for ids %d to %d to %s: %w", name, from, to-1, parentQ, err)
	}
	return created, nil
}

// Statements are the SQL that makes the table partQ the partition [from,
// to) of parentQ (both quoted and qualified), as Add runs it for a role
// that owns parentQ, for a script (`outbox migrate print --partitioned`).
func Statements(parentQ, partQ string, from, to int64) []string {
	return []string{
		fmt.Sprintf(createSQL, partQ, parentQ),
		fmt.Sprintf(boundsSQL, partQ, from, to),
		fmt.Sprintf(attachSQL, parentQ, partQ, from, to),
	}
}

func create(ctx context.Context, tx pgx.Tx, parentQ, partQ string, from, to int64) error {
	stmts := Statements(parentQ, partQ, from, to)
	for _, stmt := range stmts[:2] {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	// The partition belongs to the outbox table's owner, whoever made
	// it (a member of that role): so that the owner's later migrations,
	// which recurse into every partition, may change it.
	var owner string
	var same bool
	if err := tx.QueryRow(ctx, ownerSQL, parentQ).Scan(&owner, &same); err != nil {
		return err
	}
	if !same {
		if _, err := tx.Exec(ctx, fmt.Sprintf(ownerToSQL, partQ, pgident.Quote(owner))); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, stmts[2])
	return err
}

// Attach attaches the table name (unquoted, in schema), a detached
// partition, back to parent for [from, to): the undo of a detach whose
// table turned out to hold rows that must not be dropped. Its CHECK on the
// bounds (Add's, or the one DETACH CONCURRENTLY adds) spares the scan.
func Attach(ctx context.Context, db outbox.DB, schema, parent, name string, from, to int64) error {
	parentQ, partQ := pgident.Qualified(schema, parent), pgident.Qualified(schema, name)
	err := retry(ctx, func() error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, lockTimeoutSQL, lockTimeout); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, fmt.Sprintf(attachSQL, parentQ, partQ, from, to))
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("partition: attach %s back to %s: %w", partQ, parentQ, err)
	}
	return nil
}

// DetachConcurrently detaches name from parent (both unquoted, in
// schema) with DETACH PARTITION ... CONCURRENTLY, on conn outside any
// transaction: it commits once the partition is marked detaching (from
// then on no new query of parent sees it), waits for every transaction
// that uses parent or the partition to end, then finishes. Should its
// session die in between, the partition stays detach-pending: Finalize.
func DetachConcurrently(ctx context.Context, conn *pgx.Conn, schema, parent, name string) error {
	return exec(ctx, conn, detachSQL, schema, parent, name)
}

// Finalize finishes the detach of name that DetachConcurrently began and
// did not finish; it waits as that does.
func Finalize(ctx context.Context, conn *pgx.Conn, schema, parent, name string) error {
	return exec(ctx, conn, finalizeSQL, schema, parent, name)
}

func exec(ctx context.Context, conn *pgx.Conn, stmt, schema, parent, name string) error {
	parentQ, partQ := pgident.Qualified(schema, parent), pgident.Qualified(schema, name)
	if _, err := conn.Exec(ctx, fmt.Sprintf(stmt, parentQ, partQ)); err != nil {
		return fmt.Errorf("partition: %s: %w", fmt.Sprintf(stmt, parentQ, partQ), err)
	}
	return nil
}

// State is where a table stands relative to the outbox table.
type State int

const (
	// Gone: no such table (dropped).
	Gone State = iota
	// Attached: a partition of the outbox table.
	Attached
	// DetachPending: a partition whose concurrent detach did not finish.
	DetachPending
	// Detached: a table of its own.
	Detached
)

func (s State) String() string {
	return [...]string{"gone", "attached", "detach pending", "detached"}[s]
}

// StateOf reads where the table name (unquoted, in schema) stands
// relative to parent.
func StateOf(ctx context.Context, db outbox.DB, schema, parent, name string) (State, error) {
	var exists, attached, pending bool
	err := db.QueryRow(ctx, stateSQL, pgident.Qualified(schema, name), pgident.Qualified(schema, parent)).Scan(&exists, &attached, &pending)
	switch {
	case err != nil:
		return Gone, fmt.Errorf("partition: look up %s.%s: %w", schema, name, err)
	case !exists:
		return Gone, nil
	case pending:
		return DetachPending, nil
	case attached:
		return Attached, nil
	}
	return Detached, nil
}

// retry is RetryLocked with this package's bound, saying what it waited
// for when it gives up.
func retry(ctx context.Context, fn func() error) error {
	err := RetryLocked(ctx, attempts, fn)
	if isLockTimeout(err) {
		return fmt.Errorf("%w (waited %s for a lock %d times: a long transaction on the outbox table?)", err, lockTimeout, attempts)
	}
	return err
}

// RetryLocked runs fn until it succeeds, fails for a reason other than a
// lock timeout (SQLSTATE 55P03, lock_not_available: a statement under a
// lock_timeout that met a long transaction), or has been tried attempts
// times, waiting a little longer after each timeout. It returns fn's last
// error, or ctx's.
func RetryLocked(ctx context.Context, attempts int, fn func() error) error {
	var err error
	for attempt := 1; attempt <= attempts; attempt++ {
		if err = fn(); !isLockTimeout(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
	return err
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}
