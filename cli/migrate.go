package cli

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/migrate"
)

func newMigrateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox tables (up), show the schema version (status), revert (down), or print the SQL (print)",
		Long: `migrate manages the outbox schema with versioned migrations embedded in this
binary. 'migrate up' applies what is missing (running it twice is a no-op);
'migrate status' prints the version a database is at; 'migrate down --to N
--yes' reverts to version N (0 drops the tables and their data); 'migrate
print' writes the SQL for a migration tool of your own.`,
	}
	groupOnly(cmd)
	up, status, down, print := newMigrateUpCmd(g), newMigrateStatusCmd(g), newMigrateDownCmd(g), newMigratePrintCmd(g)
	for _, c := range []*cobra.Command{up, status, down} {
		g.addDBFlags(c.Flags())
	}
	g.addTableFlags(print.Flags()) // print connects to nothing
	cmd.AddCommand(up, status, down, print)
	return cmd
}

func newMigrateUpCmd(g *globals) *cobra.Command {
	var (
		binary, partitioned bool
		settings            migrate.PartitionSettings
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration",
		Long: `up applies every pending migration. With --binary-payloads it then turns
binary payloads on for the outbox table: payload_bytes (bytea) and
content_type columns beside payload, so that producers can emit payloads of
exact bytes with a content type of their own (Protobuf, Avro, JSON as
written), which the relay publishes byte for byte. Catalog changes only, each
in a short transaction that waits at most 2s for its lock (and is retried):
no table rewrite. Running it again is a no-op; without the flag, a table's
setting is left as it is. 'migrate down --binary-payloads' turns it off.

With --partitioned it makes the outbox table partitioned on id: partitions of
--partition-width ids, made ahead of the id sequence by 'outbox relay' (and
'outbox partitions ensure') to last --partition-ahead at the recent rate, and
dropped whole by retention instead of deleted row by row. It replaces an empty
outbox table only (a fresh install), keeping its name, columns, id sequence,
guard and grants; on a partitioned one it changes the settings given. The
settings live in the database (<table>_partitioning), so every process agrees.
Binaries from before the layout refuse the table. See docs/partitioning.md.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := checkPartitionFlags(c, partitioned, settings); err != nil {
				return err
			}
			m, pool, err := g.migrator(c)
			if err != nil {
				return err
			}
			defer pool.Close()
			up := m.Up
			if binary {
				up = m.EnableBinaryPayloads
			}
			applied, err := up(c.Context(), pool)
			if err != nil {
				return err
			}
			if partitioned {
				if _, err := m.EnablePartitioned(c.Context(), pool, settings); err != nil {
					return err
				}
			}
			t, _ := g.tables()
			for _, v := range applied {
				fmt.Fprintf(g.stdout, "applied version %d (%s)\n", v, m.Migrations()[v-1].Name)
			}
			if len(applied) == 0 {
				fmt.Fprintf(g.stdout, "%s is up to date at version %d\n", t.OutboxIdent(), m.Latest())
			} else {
				fmt.Fprintf(g.stdout, "%s is at version %d\n", t.OutboxIdent(), m.Latest())
			}
			if binary {
				fmt.Fprintf(g.stdout, "binary payloads are on for %s; set outbox.Config.BinaryPayloads in its producers\n", t.OutboxIdent())
			}
			if partitioned {
				return printPartitioning(c, g, m, pool)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&binary, "binary-payloads", false, "also turn binary payloads on for the outbox table (payload_bytes and content_type columns)")
	f.BoolVar(&partitioned, "partitioned", false, "also make the (empty) outbox table partitioned on id, its old partitions dropped by retention")
	addPartitionFlags(f, &settings)
	return cmd
}

// addPartitionFlags registers the partitioned layout's settings (zero:
// the defaults, or as recorded).
func addPartitionFlags(f *pflag.FlagSet, s *migrate.PartitionSettings) {
	f.Int64Var(&s.Width, "partition-width", 0, fmt.Sprintf("with --partitioned: ids per partition (default %d; about a day at 1,000 events/s)", migrate.DefaultPartitionWidth))
	durationVar(f, &s.Ahead, "partition-ahead", 0, "with --partitioned: how long the partitions made ahead of the id sequence last at the recent rate (default "+formatDays(migrate.DefaultPartitionAhead)+")")
}

// checkPartitionFlags refuses the partition settings without
// --partitioned, or out of range.
func checkPartitionFlags(c *cobra.Command, partitioned bool, s migrate.PartitionSettings) error {
	if !partitioned && (c.Flags().Changed("partition-width") || c.Flags().Changed("partition-ahead")) {
		return fmt.Errorf("--partition-width and --partition-ahead are settings of the partitioned layout: add --partitioned")
	}
	if (c.Flags().Changed("partition-width") && s.Width < migrate.MinPartitionWidth) || (c.Flags().Changed("partition-ahead") && s.Ahead <= 0) {
		return fmt.Errorf("--partition-width %d and --partition-ahead %s: give at least %d ids and a positive duration, e.g. 100000000 and 3d", s.Width, formatDays(s.Ahead), migrate.MinPartitionWidth)
	}
	return nil
}

// printPartitioning prints the outbox's layout and, partitioned, its
// settings and partitions.
func printPartitioning(c *cobra.Command, g *globals, m *migrate.Migrator, db outbox.DB) error {
	p, err := m.Partitioning(c.Context(), db)
	if err != nil {
		return err
	}
	if p.Layout != migrate.LayoutPartitioned {
		fmt.Fprintf(g.stdout, "  layout: plain\n")
		return nil
	}
	t, _ := g.tables()
	parts, err := partition.List(c.Context(), db, t.OutboxIdent())
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "  layout: partitioned, %d ids a partition, made %s ahead; %d partitions\n", p.Settings.Width, formatDays(p.Settings.Ahead), len(parts))
	return nil
}

func newMigrateStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Print the schema version; exit 1 when migrations are pending",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			m, pool, err := g.migrator(c)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := m.Status(c.Context(), pool)
			if err != nil {
				return err
			}
			t, _ := g.tables()
			fmt.Fprintf(g.stdout, "%s: version %d of %d\n", t.OutboxIdent(), st.Current, st.Latest)
			if st.Current == st.Latest {
				bin, err := m.BinaryPayloads(c.Context(), pool)
				if err != nil {
					return err
				}
				fmt.Fprintf(g.stdout, "  binary payloads: %s\n", bin)
				if err := printPartitioning(c, g, m, pool); err != nil {
					return err
				}
			}
			for _, a := range st.Applied {
				name := "unknown to this binary"
				if a.Version <= m.Latest() {
					name = m.Migrations()[a.Version-1].Name
				}
				fmt.Fprintf(g.stdout, "  %3d  %-24s applied %s\n", a.Version, name, a.AppliedAt.Format("2006-01-02 15:04:05 MST"))
			}
			for _, mg := range m.Migrations()[min(st.Current, st.Latest):] {
				fmt.Fprintf(g.stdout, "  %3d  %-24s pending\n", mg.Version, mg.Name)
			}
			switch {
			case st.Current > st.Latest:
				return &exitError{code: 1, msg: "the database is newer than this binary; upgrade outbox"}
			case st.Current < st.Latest:
				return &exitError{code: 1, msg: "migrations pending; run 'outbox migrate up'"}
			}
			return nil
		},
	}
}

func newMigrateDownCmd(g *globals) *cobra.Command {
	var to string
	var yes, binary bool
	cmd := &cobra.Command{
		Use:   "down --to VERSION --yes | --binary-payloads --yes",
		Short: "Revert migrations above VERSION (destroys data), or turn binary payloads off",
		Long: `down --to VERSION reverts the migrations above VERSION (0 drops the tables
and their data). A table with binary payloads on must have them turned off
first: down --binary-payloads refuses new binary events, refuses to go on
while a pending or parked row holds one, deletes the published rows that
hold one, and drops the payload_bytes and content_type columns, without a
table rewrite.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if binary {
				return migrateBinaryOff(c, g, to, yes)
			}
			target, err := strconv.Atoi(to)
			if err != nil || to == "" {
				return fmt.Errorf("--to %q: give the version to revert to, e.g. --to 0 to drop the tables", to)
			}
			if !yes {
				return fmt.Errorf("migrate down drops tables and their data; add --yes if you mean it")
			}
			m, pool, err := g.migrator(c)
			if err != nil {
				return err
			}
			defer pool.Close()
			reverted, err := m.Down(c.Context(), pool, target)
			if err != nil {
				return err
			}
			for _, v := range reverted {
				fmt.Fprintf(g.stdout, "reverted version %d\n", v)
			}
			fmt.Fprintf(g.stdout, "at version %d\n", target)
			if slices.Contains(reverted, 1) {
				// Migration 1's down keeps a processed table that another
				// outbox of the schema may share; say so, it is no error.
				t, _ := g.tables()
				var kept bool
				err := pgx.BeginFunc(c.Context(), pool, func(tx pgx.Tx) error {
					return tx.QueryRow(c.Context(), "SELECT to_regclass($1) IS NOT NULL", t.ProcessedIdent()).Scan(&kept)
				})
				if err != nil {
					return err
				}
				if kept {
					fmt.Fprintf(g.stdout, "kept %s: other outboxes of schema %s are migrated and may share it; drop it once no consumer uses it\n", t.ProcessedIdent(), t.Schema)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "version to revert to (0 drops everything)")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm that data may be destroyed")
	cmd.Flags().BoolVar(&binary, "binary-payloads", false, "turn binary payloads off for the outbox table instead (deletes the published rows that hold one)")
	return cmd
}

// migrateBinaryOff is `migrate down --binary-payloads`.
func migrateBinaryOff(c *cobra.Command, g *globals, to string, yes bool) error {
	if to != "" {
		return fmt.Errorf("--binary-payloads and --to are separate steps: turn binary payloads off first, then revert with --to")
	}
	if !yes {
		return fmt.Errorf("migrate down --binary-payloads deletes the published rows that hold binary payloads; add --yes if you mean it")
	}
	m, pool, err := g.migrator(c)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := m.DisableBinaryPayloads(c.Context(), pool); err != nil {
		return err
	}
	t, _ := g.tables()
	fmt.Fprintf(g.stdout, "binary payloads are off for %s\n", t.OutboxIdent())
	return nil
}

func newMigratePrintCmd(g *globals) *cobra.Command {
	var (
		from, to    int
		down        bool
		partitioned bool
		settings    migrate.PartitionSettings
	)
	cmd := &cobra.Command{
		Use:   "print",
		Short: "Write the SQL of the migrations, for goose, Flyway, Atlas or psql",
		Long: fmt.Sprintf(`print writes the SQL of each migration to stdout, rendered for --schema,
--table and --processed-table, for teams whose own tool applies schema
changes. It connects to no database.

Each migration is preceded by a comment naming its version and name and
followed by the INSERT that records it in the bookkeeping table
(<table>_migrations, created first): 'outbox relay' and the operations
commands refuse to start unless that table records the latest version, so
copy each INSERT with its migration. Run each migration in one transaction;
'outbox migrate status' then says the schema is up to date.

  outbox migrate print --schema app > outbox.sql      every migration
  outbox migrate print --from 3                       only those above 3
  outbox migrate print --down --to 2                  revert %s
  outbox migrate print --partitioned                  every migration, then the
                                                      partitioned layout

The partitioned layout's part replaces the empty outbox table with a
partitioned one, partitions for the first two widths of ids included; it
refuses a table that holds rows. Keep 'outbox relay' or 'outbox partitions
ensure' running to make the next ones.`, revertExample(2)),
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			switch {
			case down && c.Flags().Changed("from"):
				return fmt.Errorf("--from is the version an upgrade starts at; with --down give --to, the version to revert to")
			case down && partitioned:
				return fmt.Errorf("--partitioned prints the partitioned layout after the migrations up; it has no --down")
			case !down && c.Flags().Changed("to"):
				return fmt.Errorf("--to is the version --down reverts to; add --down, or give --from for an upgrade")
			}
			t, err := g.tables()
			if err != nil {
				return err
			}
			m, err := migrate.New(t)
			if err != nil {
				return err
			}
			if down {
				if to < 0 || to > m.Latest() {
					return fmt.Errorf("--to %d: give a version from 0 (drop the tables) to %d", to, m.Latest())
				}
				return m.DownScript(g.stdout, to)
			}
			if from < 0 || from > m.Latest() {
				return fmt.Errorf("--from %d: give the version the database is at, 0 to %d", from, m.Latest())
			}
			if err := checkPartitionFlags(c, partitioned, settings); err != nil {
				return err
			}
			if err := m.UpScript(g.stdout, from); err != nil || !partitioned {
				return err
			}
			return m.PartitionedScript(g.stdout, settings)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&partitioned, "partitioned", false, "also print the SQL that makes the empty outbox table partitioned on id")
	addPartitionFlags(f, &settings)
	f.IntVar(&from, "from", 0, "the version the database is at: print only the migrations above it")
	f.BoolVar(&down, "down", false, "print the down migrations instead, newest first (they destroy data)")
	f.IntVar(&to, "to", 0, "with --down: the version to revert to (0 drops the tables)")
	return cmd
}

// revertExample says which versions 'migrate print --down --to to'
// reverts with this binary's migrations, newest first: "versions 6 to 3
// (newest first)".
func revertExample(to int) string {
	m, err := migrate.New(outbox.Tables{})
	if err != nil || m.Latest() <= to {
		return "every version above it (newest first)"
	}
	if m.Latest() == to+1 {
		return fmt.Sprintf("version %d", m.Latest())
	}
	return fmt.Sprintf("versions %d to %d (newest first)", m.Latest(), to+1)
}

func (g *globals) migrator(c *cobra.Command) (*migrate.Migrator, interface {
	outbox.DB
	Close()
}, error) {
	t, err := g.tables()
	if err != nil {
		return nil, nil, err
	}
	m, err := migrate.New(t)
	if err != nil {
		return nil, nil, err
	}
	pool, err := g.connect(c.Context(), 2)
	if err != nil {
		return nil, nil, err
	}
	return m, pool, nil
}
