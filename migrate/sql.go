package migrate

import (
	"strconv"

	"github.com/pgoutbox/outbox/internal/sqltext"
)

// The migrations themselves are the embedded sql/NNN_name.{up,down}.sql
// files, rendered by New with sqltext's placeholders. The statements here
// keep their bookkeeping: the table of applied versions, read by its
// primary key (version), and the lock concurrent runs serialise on.

// lockSQL takes the migration lock (internal/lockkey.Migration) for the
// migration's transaction; $1 is the key.
const lockSQL = `SELECT pg_advisory_xact_lock($1)`

// createSchemaSQL creates the outbox's schema, before the bookkeeping
// table that lives in it.
const createSchemaSQL = `CREATE SCHEMA IF NOT EXISTS {{schema}}`

// createVersionTableSQL creates the bookkeeping table: one row per applied
// version. Up and Validate read it, so a schema migrated by another tool
// must have it too (UpScript writes it).
const createVersionTableSQL = `CREATE TABLE IF NOT EXISTS {{migrations}} (
  version    INT         PRIMARY KEY,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)`

// currentSQL is the highest applied version, 0 for none.
const currentSQL = `SELECT coalesce(max(version), 0) FROM {{migrations}}`

// existsSQL tells whether the bookkeeping table exists (a database never
// migrated has none); $1 is its quoted name.
const existsSQL = `SELECT to_regclass($1) IS NOT NULL`

// appliedSQL lists the applied versions in order.
const appliedSQL = `SELECT version, applied_at FROM {{migrations}} ORDER BY version`

// recordSQL and unrecordSQL record and unrecord one applied version. The
// version is a literal, not a parameter, so that the statements also stand
// in a script (UpScript, DownScript).
func (m *Migrator) recordSQL(version int) string {
	return "INSERT INTO " + m.versionTbl + " (version) VALUES (" + strconv.Itoa(version) + ")"
}

func (m *Migrator) unrecordSQL(version int) string {
	return "DELETE FROM " + m.versionTbl + " WHERE version = " + strconv.Itoa(version)
}

var _ = sqltext.Register("migrate", map[string]string{
	"lockSQL": lockSQL, "createSchemaSQL": createSchemaSQL, "createVersionTableSQL": createVersionTableSQL,
	"currentSQL": currentSQL, "existsSQL": existsSQL, "appliedSQL": appliedSQL,
})
