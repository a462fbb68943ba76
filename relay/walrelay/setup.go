package walrelay

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// Errors a WAL relayer cannot ride out: Run returns them (wrapped, as one
// line that says what to do). Check them with errors.Is.
var (
	// ErrWALLevel: the server does not write logical WAL (wal_level is
	// replica or minimal).
	ErrWALLevel = errors.New("walrelay: the server's wal_level is not logical")
	// ErrSlotLost: the slot was invalidated (wal_status = lost): the WAL it
	// still needed was removed, so events may have been missed; or the
	// slot is gone though the publication records that it was created
	// (Setup), and a new one would skip what was committed meanwhile.
	ErrSlotLost = errors.New("walrelay: the replication slot was invalidated")
	// ErrSlotBusy: another process, not a relayer holding the leader lock,
	// reads the slot.
	ErrSlotBusy = errors.New("walrelay: the replication slot is in use by another process")
	// ErrNotThisOutbox: the publication is not of exactly this outbox's
	// table, or the slot is another database's or not a pgoutput slot:
	// streaming it would confirm a position without publishing this
	// outbox's events.
	ErrNotThisOutbox = errors.New("walrelay: the slot or publication is not this outbox's")
	// ErrLegacySlot: the slot and publication were left to their
	// defaults, and this database has the outbox's slot under the default
	// name of earlier versions, not under this one's (Names).
	ErrLegacySlot = errors.New("walrelay: the outbox's slot has the default name of an earlier version")
	// ErrPendingBeforeSlot: Setup created the slot and found events
	// committed before it that are still pending: the WAL source would
	// never publish them. Setup dropped the slot again; move the outbox
	// with `outbox switch to-wal`.
	ErrPendingBeforeSlot = errors.New("walrelay: events older than the new replication slot were never published")
)

// DefaultName is the slot and publication name for the outbox t in the
// database named database when Config.Slot and Config.Publication are
// empty: "outbox_<database>_<table>" for the public schema,
// "outbox_<database>_<schema>_<table>" otherwise (lower-cased, any
// character but a letter, digit or underscore made an underscore), cut
// to 54 bytes, then "_" and 8 hex digits of a hash of the three names.
// Replication slots are named cluster-wide, so the database is in the
// name; the hash keeps two outboxes apart whose names read the same once
// cut or joined.
func DefaultName(database string, t outbox.Tables) string {
	t = t.WithDefaults()
	n := "outbox_" + database + "_" + t.Outbox
	if t.Schema != outbox.DefaultSchema {
		n = "outbox_" + database + "_" + t.Schema + "_" + t.Outbox
	}
	b := []byte(strings.ToLower(n))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > pgident.MaxLen-9 {
		b = b[:pgident.MaxLen-9]
	}
	sum := sha256.Sum256([]byte(database + "\x00" + t.Schema + "\x00" + t.Outbox))
	return string(b) + "_" + hex.EncodeToString(sum[:4])
}

// legacyName is DefaultName as it was before it named the database and
// ended in a hash: "outbox_<table>" or "outbox_<schema>_<table>", cut to
// 63 bytes. A relayer upgraded in place finds its slot under it.
func legacyName(t outbox.Tables) string {
	t = t.WithDefaults()
	n := "outbox_" + t.Outbox
	if t.Schema != outbox.DefaultSchema {
		n = "outbox_" + t.Schema + "_" + t.Outbox
	}
	if len(n) > pgident.MaxLen {
		n = n[:pgident.MaxLen]
	}
	return n
}

// databaseOf is the database a pool connects to: its configured name, or,
// as the server reads an unset one, the user's.
func databaseOf(cc *pgx.ConnConfig) string {
	if cc.Database != "" {
		return cc.Database
	}
	return cc.User
}

// DefaultNameOf is DefaultName for the database pool connects to.
func DefaultNameOf(pool *pgxpool.Pool, t outbox.Tables) string {
	return DefaultName(databaseOf(pool.Config().ConnConfig), t)
}

// Names resolves the slot and publication of the outbox t, as the CLI
// does before it starts a relayer: each given name is kept; an empty one
// is DefaultName for the session's database, unless no slot has that
// name and both are empty while this database has a pgoutput slot and a
// publication of exactly this outbox under the name of the default
// before it named the database (legacyName): a relayer upgraded in place
// then keeps them (legacy is true), where a new slot would start at the
// current position and skip what is pending in the old one.
func Names(ctx context.Context, db outbox.DB, t outbox.Tables, slot, publication string) (s, p string, legacy bool, err error) {
	t = t.WithDefaults()
	if slot != "" && publication != "" {
		return slot, publication, false, nil
	}
	var database string
	if err := db.QueryRow(ctx, `SELECT current_database()`).Scan(&database); err != nil {
		return "", "", false, fmt.Errorf("walrelay: read the database's name: %w", err)
	}
	def := DefaultName(database, t)
	s, p = cmp.Or(slot, def), cmp.Or(publication, def)
	if slot != "" || publication != "" {
		return s, p, false, nil
	}
	old, err := legacySlot(ctx, db, t, def)
	if err != nil || old == "" {
		return s, p, false, err
	}
	return old, old, true, nil
}

// legacySQL reads whether, with no slot named $1 (the default), this
// database has a pgoutput slot named $2 (legacyName) and a publication of
// that name for exactly the outbox table ($3 schema, $4 table).
const legacySQL = `SELECT NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)
  AND EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2 AND database = current_database() AND plugin = 'pgoutput')
  AND (SELECT array_agg(schemaname::text || '.' || tablename::text) FROM pg_publication_tables WHERE pubname = $2) = ARRAY[$3 || '.' || $4]`

// legacySlot returns legacyName(t) when the outbox's slot is under it
// and none under def; "" otherwise.
func legacySlot(ctx context.Context, db outbox.DB, t outbox.Tables, def string) (string, error) {
	old := legacyName(t)
	if old == def {
		return "", nil
	}
	var found bool
	if err := db.QueryRow(ctx, legacySQL, def, old, t.Schema, t.Outbox).Scan(&found); err != nil {
		return "", fmt.Errorf("walrelay: look up slot %s (the default name of earlier versions): %w", old, err)
	}
	if !found {
		return "", nil
	}
	return old, nil
}

// Setup creates, when missing, the publication of the outbox's inserts
// (FOR TABLE <outbox> WITH (publish = 'insert')) and the logical slot
// (pgoutput) the WAL relayer reads. It is idempotent, and Run calls it.
// Once the slot exists, it marks the publication (a comment): a slot that
// later disappears while its publication stays is not created again, as a
// new slot would start at the current position and skip what was
// committed since the old one's; Setup fails with ErrSlotLost instead.
// The publication is created first: pgoutput reads it as of each change
// it decodes, so a slot older than its publication fails on the changes
// in between. Creating a slot waits for the transactions open at that
// moment to end.
//
// Events committed before the slot exists are not in it. So Setup creates
// the slot on a replication connection that exports the snapshot of the
// slot's starting point, and counts in that snapshot the outbox rows no
// polling relayer dispatched: exactly the events older than the slot that
// nobody published. If there are any it drops the slot, and the
// publication if it created it, so that the next run checks again, and
// fails with ErrPendingBeforeSlot: move such an outbox with `outbox
// switch to-wal` (SetupAllowPending), as docs/wal.md says. db must be a
// *pgxpool.Pool or a *pgx.Conn: the replication connection uses its
// configuration.
//
// Drop both with Teardown (`outbox relay --mode wal --teardown`). A slot
// nobody reads keeps WAL on the server's disk without limit (unless
// max_slot_wal_keep_size is set): drop the slot of an outbox you stop
// relaying from the WAL.
func Setup(ctx context.Context, db outbox.DB, t outbox.Tables, slot, publication string) error {
	return setup(ctx, db, t, slot, publication, true)
}

// SetupAllowPending is Setup without the check for pending rows older
// than a new slot: for a switch from the polling relay (ops/switchover,
// `outbox relay --mode wal --setup-only`), whose polling relayers publish
// those rows while the new slot collects what follows.
func SetupAllowPending(ctx context.Context, db outbox.DB, t outbox.Tables, slot, publication string) error {
	return setup(ctx, db, t, slot, publication, false)
}

func setup(ctx context.Context, db outbox.DB, t outbox.Tables, slot, publication string, check bool) error {
	t = t.WithDefaults()
	if err := validNames(slot, publication); err != nil {
		return err
	}
	if err := checkWALLevel(ctx, db); err != nil {
		return err
	}
	pubCreated, err := ensurePublication(ctx, db, t, slot, publication)
	if err != nil {
		return err
	}
	if err := checkSlotHome(ctx, db, slot); err != nil {
		return err
	}
	var marker *string
	if err := db.QueryRow(ctx, publicationMarkerSQL, publication).Scan(&marker); err != nil {
		return fmt.Errorf("walrelay: read the comment of publication %s: %w", publication, err)
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&exists); err != nil {
		return fmt.Errorf("walrelay: look up slot %s: %w", slot, err)
	}
	has := func(m string) bool { return marker != nil && *marker == m }
	switch {
	case !exists && has(slotMarker(slot)):
		// The slot was created once and is gone: recreating it would start
		// at the current position and skip what was committed since the
		// old one's.
		return fmt.Errorf("%w: slot %s is gone (dropped by hand, or lost in a failover to a server that did not have it), but publication %s records that it was created: the events committed since its last acknowledged position were not relayed, and a new slot would start after them; republish the gap from the table (outbox relay --mode poll, plain-insert mode), then drop the publication and start again (outbox relay --mode wal --teardown)", ErrSlotLost, slot, publication)
	case exists && check && has(creatingMarker(slot)):
		// A Setup stopped between creating the slot and checking what is
		// older than it: nobody has read the slot, and only a new one
		// comes with the snapshot the check needs.
		if _, err := db.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
			return fmt.Errorf("walrelay: drop slot %s, which an interrupted setup created without checking the outbox for events older than it, to create it again (stop whatever reads it): %w", slot, err)
		}
		exists = false
	}
	if !exists {
		if err := createSlot(ctx, db, t, slot, publication, check); err != nil {
			if errors.Is(err, ErrPendingBeforeSlot) && pubCreated {
				err = dropCreatedPublication(ctx, db, publication, err)
			}
			return err
		}
	}
	// Marked only once the slot exists and was checked (and marked then
	// if an earlier Setup, or a version without markers, stopped short),
	// so that a publication without its slot means "lost" only if the
	// slot was there once.
	if !has(slotMarker(slot)) {
		if err := markPublication(ctx, db, slot, publication, slotMarker(slot)); err != nil {
			return err
		}
	}
	return nil
}

// ensurePublication creates the publication of the outbox's inserts when
// missing and checks that it is exactly this outbox's; created says
// whether this call created it.
func ensurePublication(ctx context.Context, db outbox.DB, t outbox.Tables, slot, publication string) (created bool, err error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, publication).Scan(&exists); err != nil {
		return false, fmt.Errorf("walrelay: look up publication %s: %w", publication, err)
	}
	partitioned, err := isPartitioned(ctx, db, t)
	if err != nil {
		return false, err
	}
	if !exists {
		// A partitioned outbox (the partitioned layout) is published as
		// itself: without publish_via_partition_root, pgoutput reports
		// each insert as its partition's, which is not the outbox.
		with := "publish = 'insert'"
		if partitioned {
			with += ", publish_via_partition_root = true"
		}
		_, err := db.Exec(ctx, "CREATE PUBLICATION "+pgident.Quote(publication)+" FOR TABLE "+t.OutboxIdent()+" WITH ("+with+")")
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42710") { // duplicate_object: a concurrent Setup
			return false, fmt.Errorf("walrelay: create publication %s for %s: %w", publication, t.OutboxIdent(), err)
		}
		created = err == nil
		// Read again: a move of the outbox (outbox partitions convert or
		// revert) that swapped the table since the first read left the
		// publication on the table now under the outbox's name (CREATE
		// PUBLICATION waits for the swap's lock, then looks the name up
		// again), or carried it to the new table itself.
		if partitioned, err = isPartitioned(ctx, db, t); err != nil {
			return created, err
		}
	}
	if err := publishViaRoot(ctx, db, t, slot, publication, partitioned); err != nil {
		return created, err
	}
	return created, checkPublication(ctx, db, t, publication)
}

// markPublication puts comment on the publication.
func markPublication(ctx context.Context, db outbox.DB, slot, publication, comment string) error {
	if _, err := db.Exec(ctx, "COMMENT ON PUBLICATION "+pgident.Quote(publication)+" IS "+quoteLiteral(comment)); err != nil {
		return fmt.Errorf("walrelay: mark publication %s as having slot %s (the role must own the publication: ALTER PUBLICATION %s OWNER TO <the relay's role>): %w", publication, slot, publication, err)
	}
	return nil
}

// creatingMarker is the comment Setup puts on the publication before it
// creates the slot, replaced by slotMarker once the slot is checked: a
// slot found under it was created by a Setup that stopped before the
// check, and is created again.
func creatingMarker(slot string) string {
	return "outbox wal relay: creating replication slot " + slot + "; not yet checked for events older than it"
}

// createSlot creates the logical slot; with check, on a replication
// connection whose exported snapshot is the slot's starting point, in
// which it counts the pending rows: each one was committed before the
// slot, so is not in it. It drops the slot again and fails with
// ErrPendingBeforeSlot when there are any.
func createSlot(ctx context.Context, db outbox.DB, t outbox.Tables, slot, publication string, check bool) error {
	if !check {
		_, err := db.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42710") { // duplicate_object: a concurrent Setup
			return fmt.Errorf("walrelay: create logical replication slot %s: %w", slot, err)
		}
		return nil
	}
	cc, err := connConfigOf(db)
	if err != nil {
		return err
	}
	if err := markPublication(ctx, db, slot, publication, creatingMarker(slot)); err != nil {
		return err
	}
	pc := cc.Config.Copy()
	pc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("walrelay: open a replication connection to create slot %s (the role needs the REPLICATION attribute): %w", slot, err)
	}
	// The exported snapshot lives as long as this connection stays idle:
	// it is closed once the count is read.
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the slot is created or not either way
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, pgident.Quote(slot), "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" {
		// Created by another session, whose Setup checks it: run again
		// to find it created and checked, or gone again.
		return fmt.Errorf("walrelay: slot %s was created by another session meanwhile; run again", slot)
	}
	if err != nil {
		return fmt.Errorf("walrelay: create logical replication slot %s: %w", slot, err)
	}
	p, err := countPendingIn(ctx, db, t, res.SnapshotName)
	if err == nil && p.n == 0 {
		return nil
	}
	// Dropped whether the count failed or found rows: a slot kept
	// unchecked would be streamed by the next run without the check.
	drop := context.WithoutCancel(ctx)
	conn.Close(drop) //nolint:errcheck // the slot is released either way; dropping it says if not
	if _, derr := db.Exec(drop, `SELECT pg_drop_replication_slot($1)`, slot); derr != nil {
		return fmt.Errorf("walrelay: drop slot %s again, created without being checked (drop it by hand: SELECT pg_drop_replication_slot('%s')): %w", slot, slot, errors.Join(err, derr))
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: %d event(s) of %s, ids %d to %d, were committed before replication slot %s existed and are still pending (dispatched_at IS NULL), so the WAL source would never publish them; the slot was dropped again. Move the outbox with `outbox switch to-wal` instead: a polling relay publishes those rows while the new slot collects what follows (docs/wal.md). Only if they were all published some other way (by a WAL relay before a teardown, say), mark them dispatched (UPDATE %s SET dispatched_at = now() WHERE dispatched_at IS NULL AND id BETWEEN %d AND %d) and start the WAL relay again", ErrPendingBeforeSlot, p.n, t.OutboxIdent(), p.min, p.max, slot, t.OutboxIdent(), p.min, p.max)
}

// pendingRows counts pending rows and their id range.
type pendingRows struct{ n, min, max int64 }

// countPendingIn counts the outbox's pending rows as of the exported
// snapshot.
func countPendingIn(ctx context.Context, db outbox.DB, t outbox.Tables, snapshot string) (pendingRows, error) {
	var p pendingRows
	tx, err := db.Begin(ctx)
	if err != nil {
		return p, fmt.Errorf("walrelay: begin the check of %s for events older than the new slot: %w", t.OutboxIdent(), err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
		return p, fmt.Errorf("walrelay: check %s for events older than the new slot: %w", t.OutboxIdent(), err)
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
		return p, fmt.Errorf("walrelay: check %s for events older than the new slot: take the slot's snapshot: %w", t.OutboxIdent(), err)
	}
	if err := tx.QueryRow(ctx, render(pendingBeforeSlotSQL, t)).Scan(&p.n, &p.min, &p.max); err != nil {
		return p, fmt.Errorf("walrelay: count the pending rows of %s older than the new slot: %w", t.OutboxIdent(), err)
	}
	return p, nil
}

// dropCreatedPublication drops the publication Setup created, after
// cause: the next run creates it again and checks again.
func dropCreatedPublication(ctx context.Context, db outbox.DB, publication string, cause error) error {
	if _, err := db.Exec(context.WithoutCancel(ctx), "DROP PUBLICATION IF EXISTS "+pgident.Quote(publication)); err != nil {
		return fmt.Errorf("%w (publication %s, created just now, could not be dropped again: %v; drop it by hand, DROP PUBLICATION %s, or leave it: the next run uses it)", cause, publication, err, pgident.Quote(publication))
	}
	return fmt.Errorf("%w; so was publication %s", cause, publication)
}

// connConfigOf is the configuration of db's connections, from which
// Setup opens its replication connection.
func connConfigOf(db outbox.DB) (*pgx.ConnConfig, error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		return d.Config().ConnConfig, nil
	case *pgx.Conn:
		return d.Config(), nil
	}
	return nil, fmt.Errorf("walrelay: Setup creates the slot on a replication connection configured as db's, and cannot read the configuration of a %T: pass a *pgxpool.Pool or a *pgx.Conn", db)
}

// isPartitioned reports whether the outbox table is partitioned (the
// partitioned layout).
func isPartitioned(ctx context.Context, db outbox.DB, t outbox.Tables) (bool, error) {
	var partitioned bool
	if err := db.QueryRow(ctx, partitionedSQL, t.OutboxIdent()).Scan(&partitioned); err != nil {
		return false, fmt.Errorf("walrelay: read the layout of %s: %w", t.OutboxIdent(), err)
	}
	return partitioned, nil
}

// publishViaRoot makes the publication of a partitioned outbox publish its
// inserts as the outbox's (publish_via_partition_root) when it does not
// yet and its slot does not exist: nothing was decoded with the setting
// off. With a slot, changes it has not confirmed would still be decoded
// as their partitions' (pgoutput reads the publication as of each
// change): checkPublication refuses, and says how to start again.
func publishViaRoot(ctx context.Context, db outbox.DB, t outbox.Tables, slot, publication string, partitioned bool) error {
	if !partitioned {
		return nil
	}
	var viaRoot, slotExists bool
	if err := db.QueryRow(ctx, publicationViaRootSQL, publication, slot).Scan(&viaRoot, &slotExists); err != nil {
		return fmt.Errorf("walrelay: read publication %s: %w", publication, err)
	}
	if viaRoot || slotExists {
		return nil
	}
	if _, err := db.Exec(ctx, "ALTER PUBLICATION "+pgident.Quote(publication)+" SET (publish_via_partition_root = true)"); err != nil {
		return fmt.Errorf("walrelay: make publication %s publish the partitioned %s as itself (the role must own the publication): %w", publication, t.OutboxIdent(), err)
	}
	return nil
}

// checkPublication fails with ErrNotThisOutbox unless publication
// publishes the inserts of exactly the outbox table: a relayer streaming
// another table's publication would publish nothing and confirm the slot.
// A partitioned outbox must be published as itself
// (publish_via_partition_root).
func checkPublication(ctx context.Context, db outbox.DB, t outbox.Tables, publication string) error {
	var (
		found, inserts, viaRoot, partitioned bool
		tables                               []string
	)
	if err := db.QueryRow(ctx, publicationTablesSQL, publication).Scan(&found, &inserts, &tables); err != nil {
		return fmt.Errorf("walrelay: read the tables of publication %s: %w", publication, err)
	}
	if err := db.QueryRow(ctx, publicationRootSQL, publication, t.OutboxIdent()).Scan(&viaRoot, &partitioned); err != nil {
		return fmt.Errorf("walrelay: read publication %s: %w", publication, err)
	}
	want := t.Schema + "." + t.Outbox
	switch {
	case found && partitioned && !viaRoot:
		return fmt.Errorf("%w: %s is partitioned, and publication %s publishes its inserts as its partitions' (publish_via_partition_root is off), which the relay cannot tell for the outbox's: stop the WAL relayers, drop the slot and the publication (outbox relay --mode wal --teardown; events the slot had not confirmed are then relayed with outbox relay --mode poll), and start the relay again: it creates the publication with publish_via_partition_root = true", ErrNotThisOutbox, t.OutboxIdent(), publication)
	case !found:
		return fmt.Errorf("walrelay: no publication %s in this database: let the relay create it (do not set SkipSetup / --skip-setup) or create it with walrelay.Setup", publication)
	case len(tables) != 1 || tables[0] != want:
		list := strings.Join(tables, ", ")
		if list == "" {
			list = "no table"
		}
		return fmt.Errorf("%w: publication %s publishes %s, not exactly %s; give this outbox its own publication (leave --publication out for the default, %s is another outbox's or hand-made) and slot", ErrNotThisOutbox, publication, clip.Text(list, 300), t.OutboxIdent(), publication)
	case !inserts:
		return fmt.Errorf("%w: publication %s does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert'), or give this outbox its own publication", ErrNotThisOutbox, publication, publication)
	}
	var version int
	if err := db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return fmt.Errorf("walrelay: read the server's version: %w", err)
	}
	if version < 150000 {
		return nil // no row filters or column lists before Postgres 15
	}
	var rows, cols bool
	if err := db.QueryRow(ctx, publicationFilterSQL, publication, t.OutboxIdent()).Scan(&rows, &cols); err != nil {
		return fmt.Errorf("walrelay: read the row filter and column list of publication %s: %w", publication, err)
	}
	// The rows a filter leaves out are never streamed, yet the slot is
	// confirmed past them: events lost without a sound. A column list
	// leaves out columns an event needs, or its headers.
	switch {
	case rows:
		return fmt.Errorf("%w: publication %s publishes only the rows of %s that its WHERE clause passes, so the others would be skipped as the slot moves past them: ALTER PUBLICATION %s SET TABLE %s (no WHERE), or give this outbox its own publication", ErrNotThisOutbox, publication, t.OutboxIdent(), publication, t.OutboxIdent())
	case cols:
		return fmt.Errorf("%w: publication %s publishes a column list of %s, not every column an event needs: ALTER PUBLICATION %s SET TABLE %s (no column list), or give this outbox its own publication", ErrNotThisOutbox, publication, t.OutboxIdent(), publication, t.OutboxIdent())
	}
	return nil
}

// checkSlotHome fails with ErrNotThisOutbox when a slot named slot
// exists but belongs to another database (slot names are cluster-wide)
// or is not a pgoutput slot.
func checkSlotHome(ctx context.Context, db outbox.DB, slot string) error {
	var database, plugin, here string
	err := db.QueryRow(ctx, slotHomeSQL, slot).Scan(&database, &plugin, &here)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("walrelay: look up slot %s: %w", slot, err)
	}
	switch {
	case database != here:
		return fmt.Errorf("%w: slot %s belongs to database %q, not to %q (slot names are one namespace for the whole server): give this outbox another --slot (Config.Slot); the default names the database", ErrNotThisOutbox, slot, database, here)
	case plugin != "pgoutput":
		return fmt.Errorf("%w: slot %s decodes with plugin %q, not pgoutput: it is not a WAL relay's slot; give this outbox another --slot (Config.Slot)", ErrNotThisOutbox, slot, plugin)
	}
	return nil
}

// slotMarker is the comment Setup puts on the publication once the slot
// exists: the record that this outbox had a slot, which a slot that
// disappeared (a failover to a server without it, a manual drop) cannot
// take with it. Teardown drops it with the publication.
func slotMarker(slot string) string {
	return "outbox wal relay: replication slot " + slot + " created; if it is missing, events were not relayed (see outbox relay --mode wal --teardown)"
}

// quoteLiteral quotes s as an SQL string literal (for DDL, which takes no
// parameters).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Teardown drops the slot and the publication, when they exist. It fails
// while a relayer reads the slot: stop the relayers first. Events
// committed since the slot's last acknowledged position and not yet
// published are then only in the table (plain-insert mode) or gone
// (insert+delete, logical messages).
func Teardown(ctx context.Context, db outbox.DB, slot, publication string) error {
	if err := validNames(slot, publication); err != nil {
		return err
	}
	if err := waitSlotReleased(ctx, db, slot); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
		return fmt.Errorf("walrelay: drop slot %s (stop the relayers reading it first): %w", slot, err)
	}
	if _, err := db.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgident.Quote(publication)); err != nil {
		return fmt.Errorf("walrelay: drop publication %s: %w", publication, err)
	}
	return nil
}

// slotReleaseWait is how long Teardown waits for a slot to be let go: a
// relayer that has just stopped leaves its walsender reading the slot
// until the server notices that the connection closed.
const slotReleaseWait = 5 * time.Second

// waitSlotReleased waits, up to slotReleaseWait, until no process reads
// slot (or it does not exist); after that the drop fails and says why.
func waitSlotReleased(ctx context.Context, db outbox.DB, slot string) error {
	deadline := time.Now().Add(slotReleaseWait)
	for {
		var active bool
		err := db.QueryRow(ctx, `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if err != nil {
			return fmt.Errorf("walrelay: read slot %s: %w", slot, err)
		}
		if !active || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func validNames(slot, publication string) error {
	if err := pgident.Validate("slot", slot); err != nil {
		return fmt.Errorf("walrelay: %w", err)
	}
	if err := pgident.Validate("publication", publication); err != nil {
		return fmt.Errorf("walrelay: %w", err)
	}
	return nil
}

// checkWALLevel fails with ErrWALLevel unless the server decodes its WAL.
func checkWALLevel(ctx context.Context, db outbox.DB) error {
	var level string
	if err := db.QueryRow(ctx, `SELECT current_setting('wal_level')`).Scan(&level); err != nil {
		return fmt.Errorf("walrelay: read wal_level: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("%w (it is %s): set wal_level = logical (ALTER SYSTEM SET wal_level = logical) and restart Postgres, or relay by polling (outbox relay --mode poll)", ErrWALLevel, level)
	}
	return nil
}

// SlotLag is how far a slot is behind the server's WAL.
type SlotLag struct {
	// Bytes of WAL written since the slot's confirmed position: what the
	// server keeps on disk for it, at least.
	Bytes int64
	// WALStatus is the slot's wal_status: reserved, extended, unreserved
	// or lost.
	WALStatus string
	// Active is true while a relayer streams from it.
	Active bool
}

// Lag reads a slot's lag in bytes from the server (pg_current_wal_lsn() -
// confirmed_flush_lsn), for metrics and alerts; any replica can ask.
// Relayer.Lag gives the leader's lag in time.
func Lag(ctx context.Context, db outbox.DB, slot string) (SlotLag, error) {
	var l SlotLag
	err := db.QueryRow(ctx, `SELECT coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, 0), coalesce(wal_status, ''), active
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&l.Bytes, &l.WALStatus, &l.Active)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, fmt.Errorf("walrelay: no replication slot %s: start a relayer with --mode wal (it creates it)", slot)
	}
	if err != nil {
		return l, fmt.Errorf("walrelay: read lag of slot %s: %w", slot, err)
	}
	return l, nil
}
