// Package migrate creates and upgrades the outbox schema: versioned SQL
// migrations embedded in the binary, applied in order, each in its own
// transaction, recorded in a bookkeeping table next to the outbox table.
// Running Up twice is a no-op; concurrent runs serialise on an advisory lock.
// Teams whose own tool applies schema changes take the same SQL, with the
// bookkeeping that Validate reads, from UpScript and DownScript. Two
// settings of a table come after the migrations: binary payloads
// (EnableBinaryPayloads) and the partitioned layout (EnablePartitioned).
//
//	m, err := migrate.New(outbox.Tables{})
//	applied, err := m.Up(ctx, pool)
package migrate

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/lockkey"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

//go:embed sql/*.sql
var files embed.FS

// Migration is one embedded schema version.
type Migration struct {
	Version int
	Name    string
	up      string
	down    string
}

// UpSQL is the SQL that applies the migration, rendered for the
// Migrator's tables. It does not record the version: see UpScript.
func (m Migration) UpSQL() string { return m.up }

// DownSQL is the SQL that reverts the migration, rendered for the
// Migrator's tables. It does not unrecord the version: see DownScript.
func (m Migration) DownSQL() string { return m.down }

// Migrator applies the embedded migrations to one outbox's tables.
type Migrator struct {
	tables     outbox.Tables
	migrations []Migration
	ids        sqltext.Idents
	versionTbl string
	lockKey    int64
}

// New renders the migrations for tables (defaults applied, names validated).
func New(tables outbox.Tables) (*Migrator, error) {
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	tables = tables.WithDefaults()
	ids := sqltext.For(tables.Schema, tables.Outbox, tables.Processed)
	migs, err := load(ids)
	if err != nil {
		return nil, err
	}
	return &Migrator{
		tables:     tables,
		ids:        ids,
		migrations: migs,
		versionTbl: ids.Migrations,
		lockKey:    lockkey.Migration(tables.Schema, tables.Outbox),
	}, nil
}

// FailuresIdent is the quoted, schema-qualified table (migration 2) where
// relay processes record the last permanent publish failure of stuck events,
// for the watchdog to report.
func FailuresIdent(tables outbox.Tables) string {
	tables = tables.WithDefaults()
	return sqltext.For(tables.Schema, tables.Outbox, tables.Processed).Failures
}

// ParkedIdent is the quoted, schema-qualified table (migration 4) that
// holds rows parked by `outbox events park`.
func ParkedIdent(tables outbox.Tables) string {
	tables = tables.WithDefaults()
	return sqltext.For(tables.Schema, tables.Outbox, tables.Processed).Parked
}

// load reads the embedded migrations and renders them for ids (sqltext:
// {{outbox}}, {{failures}}, {{pending_idx}} and the like).
func load(ids sqltext.Idents) ([]Migration, error) {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migrate: bad migration file name %q", name)
		}
		raw, err := files.ReadFile("sql/" + name)
		if err != nil {
			return nil, err
		}
		sql := sqltext.Render(string(raw), ids)
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v}
			byVersion[v] = m
		}
		switch {
		case strings.HasSuffix(rest, ".up.sql"):
			m.Name = strings.TrimSuffix(rest, ".up.sql")
			m.up = sql
		case strings.HasSuffix(rest, ".down.sql"):
			m.down = sql
		default:
			return nil, fmt.Errorf("migrate: %q is neither .up.sql nor .down.sql", name)
		}
	}
	var out []Migration
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migrate: version %d lacks its up or down file", m.Version)
		}
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrate: versions must run 1, 2, 3...; found %d at position %d", m.Version, i+1)
		}
	}
	return out, nil
}

// Migrations lists the embedded migrations in version order.
func (m *Migrator) Migrations() []Migration { return slices.Clone(m.migrations) }

// Latest is the highest embedded version.
func (m *Migrator) Latest() int { return len(m.migrations) }

// Status says which version a database is at.
type Status struct {
	// Current is the highest applied version, 0 for none.
	Current int
	// Latest is the highest version this binary knows.
	Latest int
	// Applied lists applied versions with when they were applied.
	Applied []Applied
}

// Applied is one applied migration.
type Applied struct {
	Version   int
	AppliedAt time.Time
}

// UpToDate reports whether every embedded migration is applied.
func (s Status) UpToDate() bool { return s.Current == s.Latest }

// ErrNewerSchema is returned when the database has migrations this binary
// does not know: an older binary must not touch a newer schema.
var ErrNewerSchema = errors.New("migrate: database schema is newer than this binary")

// Status reads the applied versions. A database never migrated is at 0.
func (m *Migrator) Status(ctx context.Context, db outbox.DB) (Status, error) {
	st := Status{Latest: m.Latest()}
	err := m.inTx(ctx, db, false, func(tx pgx.Tx) error {
		applied, err := m.applied(ctx, tx)
		st.Applied = applied
		if len(applied) > 0 {
			st.Current = applied[len(applied)-1].Version
		}
		return err
	})
	return st, err
}

// Validate returns an error unless the database is at the latest version
// and the outbox's id sequence hands out ids one at a time
// (ErrSequenceCached).
func (m *Migrator) Validate(ctx context.Context, db outbox.DB) error {
	st, err := m.Status(ctx, db)
	if err != nil {
		return err
	}
	if st.Current > st.Latest {
		return fmt.Errorf("%w: it is at version %d, this binary knows up to %d; upgrade outbox", ErrNewerSchema, st.Current, st.Latest)
	}
	if st.Current < st.Latest {
		return fmt.Errorf("migrate: %s is at schema version %d of %d; run `outbox migrate up`", m.tables.OutboxIdent(), st.Current, st.Latest)
	}
	return m.checkSequenceCache(ctx, db)
}

// Up applies every pending migration, each in its own transaction, and
// returns the versions it applied (none when up to date).
func (m *Migrator) Up(ctx context.Context, db outbox.DB) ([]int, error) {
	var done []int
	for {
		var applied int
		err := m.inTx(ctx, db, true, func(tx pgx.Tx) error {
			cur, err := m.current(ctx, tx)
			if err != nil {
				return err
			}
			if cur > m.Latest() {
				return fmt.Errorf("%w: it is at version %d, this binary knows up to %d; upgrade outbox", ErrNewerSchema, cur, m.Latest())
			}
			if cur == m.Latest() {
				return nil
			}
			next := m.migrations[cur]
			if _, err := tx.Exec(ctx, next.up); err != nil {
				return fmt.Errorf("migrate: version %d (%s): %w", next.Version, next.Name, err)
			}
			if _, err := tx.Exec(ctx, m.recordSQL(next.Version)); err != nil {
				return err
			}
			applied = next.Version
			return nil
		})
		if err != nil {
			return done, err
		}
		if applied == 0 {
			return done, m.afterUp(ctx, db, done)
		}
		done = append(done, applied)
	}
}

// afterUp points the insert guard of a partitioned outbox at its root
// table again (guardRootSQL) when migrations were applied: one of them
// may have replaced the guard's function.
func (m *Migrator) afterUp(ctx context.Context, db outbox.DB, applied []int) error {
	if len(applied) == 0 {
		return nil
	}
	return m.inTx(ctx, db, true, func(tx pgx.Tx) error {
		p, err := ReadPartitioning(ctx, tx, m.tables)
		if err != nil || p.Layout != LayoutPartitioned {
			return err
		}
		_, err = tx.Exec(ctx, sqltext.Render(guardRootSQL, m.ids))
		return err
	})
}

// Down reverts migrations above target (0 drops the tables), newest first,
// and returns the versions it reverted. It destroys data: the CLI asks for
// confirmation.
func (m *Migrator) Down(ctx context.Context, db outbox.DB, target int) ([]int, error) {
	if target < 0 || target > m.Latest() {
		return nil, fmt.Errorf("migrate: target version %d is out of range 0..%d", target, m.Latest())
	}
	var done []int
	for {
		var reverted int
		err := m.inTx(ctx, db, true, func(tx pgx.Tx) error {
			cur, err := m.current(ctx, tx)
			if err != nil {
				return err
			}
			if cur > m.Latest() {
				return fmt.Errorf("%w: it is at version %d, this binary knows up to %d", ErrNewerSchema, cur, m.Latest())
			}
			if cur <= target {
				return nil
			}
			if cur == m.Latest() {
				if st, err := m.binaryState(ctx, tx); err != nil || st != BinaryOff {
					if err == nil {
						err = fmt.Errorf("migrate: %s has binary payloads %s; turn them off first (`outbox migrate down --binary-payloads`, DisableBinaryPayloads)", m.tables.OutboxIdent(), st)
					}
					return err
				}
			}
			mig := m.migrations[cur-1]
			if mig.Version == 1 {
				if err := m.dropPartitioning(ctx, tx); err != nil {
					return fmt.Errorf("migrate: reverting version 1 (%s): %w", mig.Name, err)
				}
			}
			if _, err := tx.Exec(ctx, mig.down); err != nil {
				return fmt.Errorf("migrate: reverting version %d (%s): %w", mig.Version, mig.Name, err)
			}
			if _, err := tx.Exec(ctx, m.unrecordSQL(mig.Version)); err != nil {
				return err
			}
			reverted = mig.Version
			return nil
		})
		if err != nil {
			return done, err
		}
		if reverted == 0 {
			return done, nil
		}
		done = append(done, reverted)
	}
}

// inTx runs fn in a transaction. With write set it first takes the
// migration lock and makes sure the bookkeeping table exists.
func (m *Migrator) inTx(ctx context.Context, db outbox.DB, write bool, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate: connect: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if write {
		if _, err := tx.Exec(ctx, lockSQL, m.lockKey); err != nil {
			return fmt.Errorf("migrate: take migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, sqltext.Render(createSchemaSQL, m.ids)); err != nil {
			return fmt.Errorf("migrate: create schema: %w", err)
		}
		if _, err := tx.Exec(ctx, m.versionTableSQL()); err != nil {
			return fmt.Errorf("migrate: create %s: %w", m.versionTbl, err)
		}
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// versionTableSQL creates the bookkeeping table (createVersionTableSQL).
func (m *Migrator) versionTableSQL() string {
	return sqltext.Render(createVersionTableSQL, m.ids)
}

func (m *Migrator) current(ctx context.Context, tx pgx.Tx) (int, error) {
	var v int
	err := tx.QueryRow(ctx, sqltext.Render(currentSQL, m.ids)).Scan(&v)
	return v, err
}

func (m *Migrator) applied(ctx context.Context, tx pgx.Tx) ([]Applied, error) {
	var exists bool
	if err := tx.QueryRow(ctx, existsSQL, m.versionTbl).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrate: look up %s: %w", m.versionTbl, err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := tx.Query(ctx, sqltext.Render(appliedSQL, m.ids))
	if err != nil {
		return nil, fmt.Errorf("migrate: read %s: %w", m.versionTbl, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Applied, error) {
		var a Applied
		err := r.Scan(&a.Version, &a.AppliedAt)
		return a, err
	})
}
