package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/ops/switchover"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// walOptions are the flags of `outbox relay --mode wal`.
type walOptions struct {
	slot, publication string
	teardown          bool
	setupOnly         bool
	cfg               walrelay.Config
	maxSlotLagBytes   int64
	maxSlotInactive   time.Duration
}

func (w *walOptions) register(f *pflag.FlagSet) {
	f.StringVar(&w.slot, "slot", "", "--mode wal: the logical replication slot to read (default outbox_<database>_<table>_<hash>, outbox_<database>_<schema>_<table>_<hash> outside public; an earlier version's outbox_<table> when the outbox's slot has that name)")
	f.StringVar(&w.publication, "publication", "", "--mode wal: the publication of the outbox's inserts (default: the slot's default name)")
	f.BoolVar(&w.teardown, "teardown", false, "--mode wal: drop the slot and the publication, then exit (stop the relayers first)")
	f.BoolVar(&w.setupOnly, "setup-only", false, "--mode wal: create the publication and the slot as the relay does at start, print them, and exit (moving from polling: see 'outbox switch to-wal')")
	f.BoolVar(&w.cfg.Messages, "messages", false, "--mode wal: publish message-mode events (outbox.ModeMessage: transactional logical messages with the outbox's prefix); the relay refuses to start while PUBLIC, or a role that may not insert into the outbox, can execute pg_logical_emit_message (with --setup-only: revoke it from PUBLIC)")
	durationVar(f, &w.cfg.HeartbeatInterval, "heartbeat-interval", walrelay.DefaultHeartbeatInterval, "--mode wal: how often the leader writes a heartbeat message so the slot advances while the outbox is idle")
	f.Int64Var(&w.maxSlotLagBytes, "max-slot-lag-bytes", ops.DefaultMaxSlotLagBytes, "--mode wal: the watchdog job warns when the slot is further behind than this many bytes of WAL")
	durationVar(f, &w.maxSlotInactive, "max-slot-inactive", ops.DefaultStuckAfter, "--mode wal: the watchdog job warns when the slot has had no reader for longer (PG 17+, which records since when)")
	durationVar(f, &w.cfg.Linger, "linger", walrelay.DefaultLinger, "--mode wal: how long an event may wait so that one read of the stream takes in many (less CPU per event on a busy outbox; nothing waits below about 1/linger events per second); 0 turns it off, for the lowest latency")
	durationVar(f, &w.cfg.LeaderPollInterval, "leader-poll-interval", walrelay.DefaultLeaderPollInterval, "--mode wal: how often a standby tries to take over the slot")
	durationVar(f, &w.cfg.UnknownTopicGrace, "unknown-topic-grace", walrelay.DefaultUnknownTopicGrace, "--mode wal: how long an event whose topic the broker does not know is retried, holding the stream, before it is parked")
}

// onlyForWAL refuses the WAL flags with --mode poll.
func (w *walOptions) onlyForWAL() error {
	if w.slot != "" || w.publication != "" || w.teardown || w.setupOnly {
		return errors.New("--slot, --publication, --teardown and --setup-only belong to --mode wal; add --mode wal, or drop them")
	}
	if w.cfg.Messages {
		return errors.New("--messages belongs to --mode wal: the polling relay reads rows, never messages; add --mode wal, or drop it")
	}
	return nil
}

// check refuses the --mode wal flags' values that cannot work, before
// anything connects, and maps --linger 0 (off) to walrelay's off.
func (w *walOptions) check() error {
	if w.cfg.HeartbeatInterval == 0 {
		return errors.New("--heartbeat-interval 0: use a positive duration, or a negative one to turn heartbeats off")
	}
	switch {
	case w.cfg.Linger < 0:
		return fmt.Errorf("--linger %s: use a duration such as 2ms, or 0 to turn it off", w.cfg.Linger)
	case w.cfg.Linger > time.Second:
		return fmt.Errorf("--linger %s: use at most 1s (a few milliseconds take in many transactions per read), or 0 to turn it off", w.cfg.Linger)
	case w.cfg.Linger == 0:
		w.cfg.Linger = -1 // off; walrelay reads 0 as its default
	}
	if w.maxSlotLagBytes <= 0 {
		return fmt.Errorf("--max-slot-lag-bytes %d: use a positive number of bytes, e.g. 1073741824 (1 GiB)", w.maxSlotLagBytes)
	}
	return nil
}

// oneAction refuses --setup-only with --teardown.
func (w *walOptions) oneAction() error {
	if w.setupOnly && w.teardown {
		return errors.New("--setup-only and --teardown conflict: one creates the slot and the publication, the other drops them; give one")
	}
	return nil
}

// names resolves --slot and --publication (walrelay.Names): an outbox
// whose slot has the default name of an earlier version keeps it, with a
// log line.
func (w *walOptions) names(ctx context.Context, pool *pgxpool.Pool, t outbox.Tables, log *slog.Logger) (slot, publication string, err error) {
	slot, publication, legacy, err := walrelay.Names(ctx, pool, t, w.slot, w.publication)
	if err != nil {
		return "", "", err
	}
	if legacy {
		log.Info("using the outbox's slot and publication under the default name of an earlier version; pass --slot and --publication to say so, or to choose others", "slot", slot, "publication", publication)
	}
	return slot, publication, nil
}

// runWALTeardown drops the slot and the publication.
func runWALTeardown(ctx context.Context, g *globals, o *relayOptions, log *slog.Logger) error {
	t, err := g.tables()
	if err != nil {
		return err
	}
	pool, err := g.connect(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	slot, pub, err := o.wal.names(ctx, pool, t, log)
	if err != nil {
		return err
	}
	if err := walrelay.Teardown(ctx, pool, slot, pub); err != nil {
		return err
	}
	log.Info("dropped the replication slot and the publication", "slot", slot, "publication", pub)
	return nil
}

// runWALSetupOnly creates the publication and the slot (walrelay.Setup,
// as the relay does at start) and says what it created, where the slot
// starts, and what a polling relayer has left to dispatch before the WAL
// source may start.
func runWALSetupOnly(ctx context.Context, g *globals, o *relayOptions) error {
	pool, t, err := g.opsPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	s, err := switchover.SetupWAL(ctx, pool, t, o.wal.slot, o.wal.publication)
	if err != nil {
		return err
	}
	printWALSetup(g, t, s)
	if o.wal.cfg.Messages {
		printSecureMessages(ctx, g, pool, t)
	}
	if s.ReaderPID != 0 {
		return nil // the WAL source runs: rows say nothing of what is pending
	}
	cut, pending, err := switchover.ReadWALCut(ctx, pool, t)
	if err != nil {
		return err
	}
	mode := "--mode wal"
	if o.wal.cfg.Messages {
		mode += " --messages"
	}
	start := relayCommand(t, mode, o.wal.slot, o.wal.publication)
	if pending == 0 {
		fmt.Fprintf(g.stdout, "no row up to id %d (the cut) is pending: nothing older than the slot waits for a polling relayer; stop any polling relayer (SIGTERM), then start %s\n", cut, start)
	} else {
		fmt.Fprintf(g.stdout, "%d row(s) up to id %d (the cut) are pending: an event the slot lacks has an id at most the cut, so let the polling relayers dispatch them first ('outbox switch to-wal' waits for that), then stop them (SIGTERM) and start %s\n", pending, cut, start)
	}
	fmt.Fprintln(g.stdout, "Until a WAL relayer reads it, the slot keeps WAL on the server's disk.")
	return nil
}

// printSecureMessages revokes pg_logical_emit_message from PUBLIC, as
// --messages requires, or prints what to run as a superuser; then says
// whether the relay with --messages would start.
func printSecureMessages(ctx context.Context, g *globals, pool *pgxpool.Pool, t outbox.Tables) {
	stmts, err := walrelay.SecureMessages(ctx, pool)
	if err != nil {
		fmt.Fprintf(g.stdout, "message-mode events: not secured: %v\n", err)
		return
	}
	fmt.Fprintf(g.stdout, "message-mode events: ran %s\n", strings.Join(stmts, " "))
	fmt.Fprintf(g.stdout, "producers write message-mode events through a function that draws their ids; grant them: GRANT EXECUTE ON FUNCTION %s TO <producers' role>;\n", walrelay.EmitMessageFunc(t))
	if grant, err := walrelay.GrantMessagesSQL(ctx, pool, "<role>"); err == nil {
		fmt.Fprintf(g.stdout, "grant it back only to the relay's role (for its heartbeats) and to that function's owner, unless they are superusers: %s\n", grant)
	}
	if err := walrelay.CheckMessages(ctx, pool, t); err != nil {
		fmt.Fprintf(g.stdout, "the relay with --messages would refuse to start: %v\n", err)
	}
}

// runWALRelay runs the WAL source, configured with the shared flags in
// common, until ctx is cancelled.
func runWALRelay(ctx context.Context, o *relayOptions, common relay.Common) error {
	if err := checkSchema(ctx, common.Pool, common.Tables); err != nil {
		return err
	}
	var err error
	cfg := o.wal.cfg
	cfg.Common = common
	if cfg.Slot, cfg.Publication, err = o.wal.names(ctx, common.Pool, common.Tables, common.Logger); err != nil {
		return err
	}
	lanes := monitor.NewLaneMetrics()
	cfg.Hooks = append(slices.Clip(cfg.Hooks), lanes)
	r, err := walrelay.New(cfg)
	if err != nil {
		return err
	}
	stopOps, err := o.ops.startWAL(ctx, r, lanes, ops.WatchdogConfig{MaxSlotLagBytes: o.wal.maxSlotLagBytes, MaxInactive: o.wal.maxSlotInactive})
	if err != nil {
		return err
	}
	defer stopOps()
	o.ops.running(r)
	defer o.startProcs(ctx, r, common)()
	if err := r.Run(ctx); err != nil {
		return fmt.Errorf("relay --mode wal: %w", err)
	}
	return nil
}
