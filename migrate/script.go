package migrate

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/pgoutbox/outbox/internal/sqltext"
)

// UpScript writes, as one SQL script, the migrations above version from
// (0 for a new database), in order, rendered for the Migrator's tables:
// for teams whose own tool (goose, Flyway, Atlas, psql) applies schema
// changes. Each migration is preceded by a comment naming its version and
// name, and followed by the INSERT that records it in the bookkeeping
// table, which the script creates first: Validate, and so `outbox relay`
// and the operations commands, refuse a table whose recorded version is
// not Latest. Run each migration with its INSERT in one transaction.
func (m *Migrator) UpScript(w io.Writer, from int) error {
	if from < 0 || from > m.Latest() {
		return fmt.Errorf("migrate: from version %d is out of range 0..%d", from, m.Latest())
	}
	b := bufio.NewWriter(w)
	if m.scriptHeader(b, "up", from+1, m.Latest()) {
		return b.Flush()
	}
	fmt.Fprintf(b, `-- Each migration below ends with the INSERT that records it in
-- %s: 'outbox relay', 'outbox consume' and the
-- operations commands refuse to start unless that table records
-- version %d. Copy each INSERT with its migration into your tool's
-- migrations, run each migration with its INSERT in one transaction, and
-- check with 'outbox migrate status'. The schema and that table come first.

%s;

%s;
`, m.versionTbl, m.Latest(), sqltext.Render(createSchemaSQL, m.ids), m.versionTableSQL())
	for _, mig := range m.migrations[from:] {
		fmt.Fprintf(b, "\n-- outbox migration %d: %s (up)\n\n", mig.Version, mig.Name)
		writeSQL(b, mig.up)
		fmt.Fprintf(b, "\n%s;\n", m.recordSQL(mig.Version))
	}
	return b.Flush()
}

// DownScript writes, as one SQL script, the down migrations that revert a
// database at Latest to version to (0 drops the tables), newest first,
// each followed by the DELETE that unrecords it: what Down does, for
// another tool to run. Reverting destroys data.
func (m *Migrator) DownScript(w io.Writer, to int) error {
	if to < 0 || to > m.Latest() {
		return fmt.Errorf("migrate: target version %d is out of range 0..%d", to, m.Latest())
	}
	b := bufio.NewWriter(w)
	if m.scriptHeader(b, "down", m.Latest(), to+1) {
		return b.Flush()
	}
	fmt.Fprintf(b, `-- Reverting destroys the data of the tables it drops. Each migration below
-- ends with the DELETE that unrecords it in
-- %s; run each with its DELETE in one transaction.
`, m.versionTbl)
	for i := m.Latest() - 1; i >= to; i-- {
		mig := m.migrations[i]
		fmt.Fprintf(b, "\n-- outbox migration %d: %s (down)\n\n", mig.Version, mig.Name)
		writeSQL(b, mig.down)
		fmt.Fprintf(b, "\n%s;\n", m.unrecordSQL(mig.Version))
	}
	return b.Flush()
}

// scriptHeader names the tables and the versions a script applies (up)
// or reverts (down), first to last in the order they run; it reports
// whether there are none.
func (m *Migrator) scriptHeader(b *bufio.Writer, dir string, first, last int) (none bool) {
	fmt.Fprintf(b, "-- outbox schema for %s (processed table %s):\n", m.tables.OutboxIdent(), m.tables.ProcessedIdent())
	switch {
	case dir == "up" && first > last:
		fmt.Fprintf(b, "-- nothing to apply: version %d is the latest.\n", m.Latest())
		return true
	case dir == "down" && first < last:
		fmt.Fprintf(b, "-- nothing to revert: the target, version %d, is the latest.\n", m.Latest())
		return true
	case first == last:
		fmt.Fprintf(b, "-- migration %d, %s.\n--\n", first, dir)
	default:
		fmt.Fprintf(b, "-- migrations %d to %d, %s.\n--\n", first, last, dir)
	}
	return false
}

// writeSQL writes a migration's SQL ending with exactly one newline.
func writeSQL(b *bufio.Writer, sql string) {
	b.WriteString(strings.TrimRight(sql, "\n"))
	b.WriteString("\n")
}

// PartitionedScript writes, as one SQL script, what EnablePartitioned does
// to a fresh install (settings s, defaults for zero fields): the empty
// outbox table replaced by a partitioned one, its settings recorded, and
// partitions for the first two widths of ids. Run it in one transaction,
// after UpScript's migrations; it refuses (raises) when the table holds
// rows, is in a publication, or its sequence is past the first width.
// The next partitions come from `outbox partitions ensure` or a relay.
func (m *Migrator) PartitionedScript(w io.Writer, s PartitionSettings) error {
	if err := s.Validate(); err != nil {
		return err
	}
	s = s.WithDefaults()
	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `
-- The partitioned layout of %s: range partitions of %d ids on id, each
-- dropped whole by retention once its rows are published and older than
-- the retention ('outbox cleanup', the relay's cleanup job). Run it in one
-- transaction, after the migrations above, on an empty table. It makes
-- partitions for ids 0 to %d; 'outbox relay' (every --partition-interval)
-- or 'outbox partitions ensure' must then make the next ones ahead, or
-- inserts fail once the ids pass the last partition.
`, m.tables.OutboxIdent(), s.Width, 3*s.Width-1)
	for _, stmt := range m.partitionScript(s, 1) {
		b.WriteString("\n")
		writeSQL(b, stmt+";")
	}
	return b.Flush()
}
