// Package cli is the `outbox` command line: one cobra command per file,
// wired in NewRoot. cmd/outbox is a thin main around Main.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
)

// Main runs the CLI with args and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	root := NewRoot(stdout, stderr)
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// SIGTERM or SIGINT while the command was still starting (say,
		// connecting): a stop that was asked for, not a failure.
		return 0
	}
	var ex *exitError
	if errors.As(err, &ex) {
		if ex.msg != "" {
			fmt.Fprintln(stderr, prefixed(oneLine(ex.msg)))
		}
		return ex.code
	}
	fmt.Fprintln(stderr, prefixed(oneLine(err.Error())))
	return 1
}

// prefixed starts msg with "outbox: " once: the library's errors carry
// that prefix of their own.
func prefixed(msg string) string {
	for strings.HasPrefix(msg, "outbox: ") {
		msg = strings.TrimPrefix(msg, "outbox: ")
	}
	return "outbox: " + msg
}

// exitError ends the command with a specific exit code (watchdog's 1 for
// "something is wrong", say) and an optional message.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// oneLine is s on one line with what a terminal could act on escaped: line
// breaks and runs of white space become one space, control characters
// and the like become visible escapes (clip.Printable). Errors and reasons
// quote what was read from the outbox, which its writer chose.
func oneLine(s string) string { return clip.Printable(strings.Join(strings.Fields(s), " ")) }

// globals are the flags every command shares.
type globals struct {
	stdout, stderr io.Writer
	databaseURL    string
	schema         string
	table          string
	processed      string
	logLevel       string
	logFormat      string
}

// NewRoot builds the command tree.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "outbox",
		Short: "Transactional outbox for Postgres: write a row and publish an event, atomically",
		Long: `outbox makes "write to Postgres and publish an event" atomic. Applications
insert events into the events_outbox table in their own transaction
(outbox.Emit); 'outbox relay' publishes committed events to Kafka, in order
per aggregate, at least once; consumers deduplicate by event_id.

Configuration comes from flags, with environment fallbacks:
  DATABASE_URL    Postgres connection string (libpq defaults when unset)
  KAFKA_BROKERS   comma-separated host:port list`,
		Version:       version(),
		SilenceUsage:  true,
		SilenceErrors: true,
		// Cobra runs only the nearest PersistentPreRunE, so no subcommand
		// may set its own.
		PersistentPreRunE: func(c *cobra.Command, _ []string) error {
			// The environment is read only when a command runs: a flag
			// default shows in every --help, and a connection string
			// carries a password.
			if f := c.Flags().Lookup("database-url"); f != nil && !f.Changed {
				g.databaseURL = os.Getenv("DATABASE_URL")
			}
			// Every command checks the logging flags, whether or not it
			// logs, so a typo is an error and not a silent default.
			log, err := g.logger()
			if err != nil {
				return err
			}
			// OTLP trace export when OTEL_EXPORTER_OTLP_* ask for it
			// (tracing.go); flushed when the command's run returns.
			return startTracing(c, log)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%s (see '%s --help')", suggestFlag(c, err), c.CommandPath())
	})
	pf := root.PersistentFlags()
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format: text or json")

	root.AddCommand(
		newMigrateCmd(g),
		newRelayCmd(g),
		newConsumeCmd(g),
		newDevKafkaCmd(g),
		newStatsCmd(g),
		newDemoCmd(g),
		newEventsCmd(g),
		newDLQCmd(g),
		newWatchdogCmd(g),
		newCleanupCmd(g),
		newPartitionsCmd(g),
		newSwitchCmd(g),
		newBenchCmd(g),
		newContractsCmd(g),
	)
	warnOnStderr(root, stderr)
	return root
}

// addURLFlag registers --database-url on a command that connects.
func (g *globals) addURLFlag(f *pflag.FlagSet) {
	// The default stays empty: the root's PersistentPreRunE reads
	// DATABASE_URL when the flag is not given.
	f.StringVar(&g.databaseURL, "database-url", "", "Postgres connection string (default: env DATABASE_URL; libpq defaults (PGHOST, ...) when both are empty)")
}

// addTableFlags registers the flags naming the outbox's tables on a
// command that works on them.
func (g *globals) addTableFlags(f *pflag.FlagSet) {
	f.StringVar(&g.schema, "schema", outbox.DefaultSchema, "schema holding the outbox tables")
	f.StringVar(&g.table, "table", outbox.DefaultOutboxTable, "outbox table name")
	f.StringVar(&g.processed, "processed-table", outbox.DefaultProcessedTable, "consumer dedupe table name")
}

// addDBFlags registers the database flags of a command that connects to
// an outbox: they are not root flags, so that the commands that do not
// (dev-kafka, migrate print) do not list them.
func (g *globals) addDBFlags(f *pflag.FlagSet) {
	g.addURLFlag(f)
	g.addTableFlags(f)
}

func (g *globals) tables() (outbox.Tables, error) {
	t := outbox.Tables{Schema: g.schema, Outbox: g.table, Processed: g.processed}
	if err := t.Validate(); err != nil {
		return t, err
	}
	return t.WithDefaults(), nil
}

func (g *globals) logger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", g.logLevel)
	}
	switch g.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: lvl, ReplaceAttr: readableText})), nil
	case "json":
		return slog.New(slog.NewJSONHandler(g.stderr, &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationStrings})), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", g.logFormat)
}

// connect opens a pool and checks the server answers, with an error that
// says where it tried and what to do.
func (g *globals) connect(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(g.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("bad database URL: %s; set --database-url or DATABASE_URL to e.g. postgres://user@localhost:5432/db", redactErr(err))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, connectError(err, &cfg.ConnConfig.Config)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("stopped while connecting to Postgres: %w", ctx.Err())
		}
		return nil, connectError(err, &cfg.ConnConfig.Config)
	}
	g.logConnected(&cfg.ConnConfig.Config)
	return pool, nil
}

// logConnected says once which database a command works on: DATABASE_URL
// or libpq's defaults may not be what the operator thinks. The logging
// flags were checked before any command ran. Never the password.
func (g *globals) logConnected(c *pgconn.Config) {
	if log, err := g.logger(); err == nil {
		log.Info("connected to Postgres", "host", c.Host, "port", c.Port, "database", c.Database, "user", c.User)
	}
}

// redactErr keeps passwords that a driver error may quote out of output.
func redactErr(err error) string {
	s := oneLine(err.Error())
	if i := strings.Index(s, "password="); i >= 0 {
		j := strings.IndexAny(s[i:], " &)")
		if j < 0 {
			j = len(s) - i
		}
		s = s[:i] + "password=***" + s[i+j:]
	}
	return s
}

// version is the module version and the commit this binary was built
// from, as the Go toolchain recorded them: "(devel)" or a pseudo-version
// for a build from a checkout, with "modified" when it had local changes.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown: built without module support)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, modified, at string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		case "vcs.time":
			at = ", " + s.Value
		}
	}
	if rev != "" {
		v += " (commit " + rev + modified + at + ")"
	}
	return v + " " + bi.GoVersion
}

// groupOnly makes cmd, which only groups subcommands, refuse anything else:
// left to cobra, "outbox migrate upp" prints migrate's help and exits 0.
func groupOnly(cmd *cobra.Command) {
	cmd.Args = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
		if c.SuggestionsMinimumDistance <= 0 {
			c.SuggestionsMinimumDistance = 2 // cobra's default, applied only for the root
		}
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
		}
		return errors.New(msg)
	}
	cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
}
