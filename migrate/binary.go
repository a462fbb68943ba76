package migrate

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// Binary payloads are a setting of one outbox table, not a numbered
// migration: a table without it stays exactly as the migrations left it.
// With it on, the table has two more columns, payload_bytes (bytea) and
// content_type (text), payload may be NULL, and a CHECK keeps exactly one
// of payload and payload_bytes set (with content_type set iff
// payload_bytes is): JSON events and binary events mix in one table, and
// every statement that reads payload alone (Emit's inserts, the SQL emit
// function, the guard, cleanup) works as before. See docs/contracts.md,
// "Payloads that are not JSON".
//
// Turning it on and off are catalog changes, each step in a transaction of
// its own with a lock_timeout, retried: no step rewrites or scans the table
// under a lock that blocks writes. The proofs over existing rows
// (VALIDATE CONSTRAINT) scan under SHARE UPDATE EXCLUSIVE, which lets
// producers, relayers and cleanup go on.

//go:embed binary/*.sql
var binaryFiles embed.FS

// BinaryState is whether an outbox table has binary payloads on.
type BinaryState int

const (
	// BinaryOff: the table takes JSON payloads only (the default).
	BinaryOff BinaryState = iota
	// BinaryOn: the table takes JSON and binary payloads.
	BinaryOn
	// BinaryPartial: a step of turning the setting on or off did not
	// finish (a lock timeout, a refused turn-off): run it again.
	BinaryPartial
)

func (s BinaryState) String() string {
	switch s {
	case BinaryOff:
		return "off"
	case BinaryOn:
		return "on"
	}
	return "partly applied"
}

// ErrBinaryRowsLeft: turning binary payloads off was refused because rows
// still hold binary payloads (pending in the outbox, or parked).
var ErrBinaryRowsLeft = errors.New("migrate: rows with binary payloads are left")

// binaryAttempts and binaryLockTimeout bound how long a step waits for its
// lock: each attempt gives up after binaryLockTimeout, so producers and
// relayers queued behind the waiting ALTER wait at most that long.
const (
	binaryAttempts    = 10
	binaryLockTimeout = "2s"
)

// BinaryPayloads reads whether m's outbox table has binary payloads on.
func (m *Migrator) BinaryPayloads(ctx context.Context, db outbox.DB) (BinaryState, error) {
	var st BinaryState
	err := m.inTx(ctx, db, false, func(tx pgx.Tx) error {
		var err error
		st, err = m.binaryState(ctx, tx)
		return err
	})
	return st, err
}

func (m *Migrator) binaryState(ctx context.Context, tx pgx.Tx) (BinaryState, error) {
	st, _, err := m.binaryStateFull(ctx, tx)
	return st, err
}

// binaryStateFull is binaryState, and whether turning the setting off has
// begun (its JSON-only CHECK exists).
func (m *Migrator) binaryStateFull(ctx context.Context, tx pgx.Tx) (BinaryState, bool, error) {
	var validated, check, jsonOnly bool
	err := tx.QueryRow(ctx, binaryStateSQL, m.ids.Outbox, m.binaryName("_payload_kind"), m.binaryName("_payload_json_only")).
		Scan(&validated, &check, &jsonOnly)
	switch {
	case err != nil:
		return 0, false, fmt.Errorf("migrate: read the binary payload setting of %s: %w", m.tables.OutboxIdent(), err)
	case !check:
		return BinaryOff, false, nil
	case validated && !jsonOnly:
		return BinaryOn, false, nil
	}
	return BinaryPartial, jsonOnly, nil
}

// binaryName is the unquoted name of a constraint of the outbox table
// (sqltext.Idents quotes it for the DDL).
func (m *Migrator) binaryName(suffix string) string {
	n := m.tables.Outbox + suffix
	if len(n) > pgident.MaxLen {
		n = n[:pgident.MaxLen]
	}
	return n
}

// EnableBinaryPayloads applies every pending migration (Up), then turns
// binary payloads on for m's outbox table, and returns the versions Up
// applied. Running it again is a no-op; after a partial run (a lock
// timeout) it finishes the steps left. Producers then emit binary events
// with outbox.Config.BinaryPayloads set; relayers see the setting on the
// table themselves. What `outbox migrate up --binary-payloads` runs.
func (m *Migrator) EnableBinaryPayloads(ctx context.Context, db outbox.DB) ([]int, error) {
	applied, err := m.Up(ctx, db)
	if err != nil {
		return applied, err
	}
	fn, err := binaryFiles.ReadFile("binary/emit_bytes.sql")
	if err != nil {
		return applied, err
	}
	steps := []binaryStep{
		{"add payload_bytes and content_type", func(st BinaryState, jsonOnly bool) bool { return st == BinaryOff },
			[]string{binaryAddSQL, binaryAddParkedSQL, string(fn), binaryMarkSQL}},
		{"validate the payload check", func(st BinaryState, jsonOnly bool) bool { return st == BinaryPartial && !jsonOnly },
			[]string{binaryValidateSQL}},
	}
	if err := m.runBinarySteps(ctx, db, steps); err != nil {
		return applied, err
	}
	return applied, nil
}

// DisableBinaryPayloads turns binary payloads off for m's outbox table: the
// table goes back to what the migrations made. It refuses, with
// ErrBinaryRowsLeft, while a pending or parked row holds a binary payload
// (publish, park and delete, or delete them first); the dispatched rows
// that hold one are deleted (they were published; cleanup would have
// deleted them after the retention). Stop the producers that emit binary
// events first: from its first step on, the table refuses them.
func (m *Migrator) DisableBinaryPayloads(ctx context.Context, db outbox.DB) error {
	steps := []binaryStep{
		// The count runs under the lock the new CHECK took, so no binary
		// row can become pending after it: the claim never updates a
		// row the CHECK refuses.
		{"refuse new binary rows", func(st BinaryState, jsonOnly bool) bool { return st != BinaryOff && !jsonOnly },
			[]string{binaryJSONOnlySQL, binaryRowsSQL}},
		{"delete published binary rows", func(st BinaryState, jsonOnly bool) bool { return jsonOnly },
			[]string{binaryDeleteDispatchedSQL, binaryValidateJSONOnlySQL}},
		{"drop payload_bytes and content_type", func(st BinaryState, jsonOnly bool) bool { return jsonOnly },
			[]string{binaryDropSQL, binaryDropParkedSQL, binaryDropFnSQL, binaryUnmarkSQL}},
	}
	return m.runBinarySteps(ctx, db, steps)
}

// binaryStep is one transaction of turning the setting on or off: it runs
// when due says so, given the state at its start.
type binaryStep struct {
	name  string
	due   func(st BinaryState, jsonOnly bool) bool
	stmts []string
}

func (m *Migrator) runBinarySteps(ctx context.Context, db outbox.DB, steps []binaryStep) error {
	for _, s := range steps {
		err := retryLocked(ctx, func() error {
			return m.inTx(ctx, db, true, func(tx pgx.Tx) error { return m.binaryStep(ctx, tx, s) })
		})
		if err != nil {
			return fmt.Errorf("migrate: binary payloads of %s: %s: %w", m.tables.OutboxIdent(), s.name, err)
		}
	}
	return nil
}

func (m *Migrator) binaryStep(ctx context.Context, tx pgx.Tx, s binaryStep) error {
	if err := m.validateIn(ctx, tx); err != nil {
		return err
	}
	st, jsonOnly, err := m.binaryStateFull(ctx, tx)
	if err != nil {
		return err
	}
	if !s.due(st, jsonOnly) {
		return nil
	}
	if _, err := tx.Exec(ctx, binaryLockTimeoutSQL, binaryLockTimeout); err != nil {
		return err
	}
	for _, stmt := range s.stmts {
		if stmt == binaryRowsSQL {
			if err := m.checkNoBinaryRows(ctx, tx); err != nil {
				return err
			}
			continue
		}
		if _, err := tx.Exec(ctx, sqltext.Render(stmt, m.ids)); err != nil {
			return err
		}
	}
	return nil
}

func (m *Migrator) checkNoBinaryRows(ctx context.Context, tx pgx.Tx) error {
	var pending, parked int64
	if err := tx.QueryRow(ctx, sqltext.Render(binaryRowsSQL, m.ids)).Scan(&pending, &parked); err != nil {
		return err
	}
	if pending+parked > 0 {
		return fmt.Errorf("%w: %d pending in %s and %d parked in %s; let the relay publish the pending ones, and unpark or delete the parked ones, then run this again (new binary events are refused meanwhile)",
			ErrBinaryRowsLeft, pending, m.tables.OutboxIdent(), parked, m.ids.Parked)
	}
	return nil
}

// validateIn is Validate inside a step's transaction: the setting applies
// to a table at the latest version only.
func (m *Migrator) validateIn(ctx context.Context, tx pgx.Tx) error {
	cur, err := m.current(ctx, tx)
	if err != nil {
		return err
	}
	if cur != m.Latest() {
		return fmt.Errorf("migrate: %s is at schema version %d of %d; run `outbox migrate up` first", m.tables.OutboxIdent(), cur, m.Latest())
	}
	return nil
}
