package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// relayOptions are the flags of `outbox relay`.
type relayOptions struct {
	kf kafkaFlags
	// common holds the flags both sources share; runRelay completes it and
	// passes it to the source --mode names.
	common  relay.Common
	cfg     relay.Config // --mode poll's own flags
	pcfg    kafkapub.PublisherConfig
	deliver time.Duration
	// sinkURL is --sink: where to publish, when not Kafka on --brokers
	// (sink.go).
	sinkURL string
	ops     relayOps // metrics, health, watchdog, cleanup: relayops.go
	// --mode wal: walrelay.go
	mode string
	wal  walOptions
	// contracts is --contracts: the event contracts both sources check
	// each event against before sending it.
	contracts contractsFlag
	// ce is --cloudevents and its settings (relay_cloudevents.go), ceCfg
	// what they make.
	ce    cloudEventsFlags
	ceCfg *cloudevents.Config
	// cleanupBatchFlag is --cleanup-batch-size as the user spelled it
	// (--cleanup-batch, deprecated, still works), for its error.
	cleanupBatchFlag string
	// cpuProfile is --cpuprofile: a CPU profile of the relay's whole run.
	cpuProfile string
	// procs is --procs: how many threads run Go code (procs.go).
	procs string
	// tx is --progress-topic and --transaction-timeout, the Kafka
	// transactions of --exactly-once.
	tx kafkapub.TxConfig
}

func newRelayCmd(g *globals) *cobra.Command {
	var o relayOptions
	var p relayProcess
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed outbox events to Kafka (run any number of replicas)",
		Long: `relay claims pending rows of the outbox table with FOR UPDATE SKIP LOCKED,
publishes them to Kafka (topic = the event type up to its first '.', plus
--topic-prefix; key = aggregate id; headers event_id, event_type,
content-type and the row's own; with --cloudevents, the CloudEvents 1.0
attributes too), and marks dispatched only what the broker acknowledged. Events of one aggregate keep their commit order, whatever the
number of replicas. Delivery is at-least-once.

It wakes on LISTEN/NOTIFY (a producer sends at most one per 10 ms), or
every --poll-interval (--poll-only behind a pooler in transaction mode);
after a batch that found rows it claims again within --busy-poll-interval,
which picks up the events committed between two notifications. While a
full batch is being published the next one is claimed on a second
connection. SIGINT/SIGTERM finish the batch in flight and
exit 0. Database and broker outages are retried with backoff.

--contracts DIR checks each event of a type with a contract before it is
sent, against its event_version header or the type's latest version; one
that breaks it is held with reason contract (parked with --mode wal) until
it is fixed and retried, and one that passes without the header is sent
with it (docs/contracts.md).

--mode wal reads committed inserts from a logical replication slot instead
(wal_level=logical; the role needs REPLICATION): no UPDATE per event, order
by commit even for producers that take no lock. It creates the publication
and the slot (--publication, --slot; default outbox_<database>_<table>_<hash>) when missing;
--setup-only creates them, prints them and exits; --teardown drops them
and exits ('outbox switch' moves an outbox between the two sources).
Replicas elect one reader; the others take over within
--leader-poll-interval of its death.

--config FILE relays the outboxes a YAML file describes, each with its own
database, table, source and sink, in one process: its keys are these
flags' names, its top level holds every outbox's defaults, and its
outboxes list each outbox's own settings; ${NAME} reads an environment
variable. Flags given here override the file's top level. --check checks
the file and prints what it resolves to, without connecting
(docs/configuration.md).`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runRelay(c, g, &o, &p)
		},
	}
	f := cmd.Flags()
	o.register(f, g)
	f.StringVar(&p.config, "config", "", "relay the outboxes a YAML file describes, in one process (its keys are these flags' names; docs/configuration.md); flags given here override its top level")
	f.BoolVar(&p.check, "check", false, "with --config: check the file and print the outboxes it resolves to (secrets hidden), without connecting; exit 1 on an error")
	return cmd
}

// register registers the flags of one outbox's relay on f: g's database
// flags and o's. `outbox relay` registers them once; a config file's
// every outbox has its own set (relayspec.go).
func (o *relayOptions) register(f *pflag.FlagSet, g *globals) {
	g.addDBFlags(f)
	o.kf.register(f)
	o.ops.register(f)
	f.StringVar(&o.common.TopicPrefix, "topic-prefix", "", "prefix for every topic name (must match the producers')")
	f.IntVar(&o.common.BatchSize, "batch-size", relay.DefaultBatchSize, "most rows per claim (see also --max-batch-bytes)")
	durationVar(f, &o.cfg.PollInterval, "poll-interval", relay.DefaultPollInterval, "how often an idle relayer looks for rows without a notification")
	f.IntVar(&o.common.MaxBatchBytes, "max-batch-bytes", relay.DefaultMaxBatchBytes, "most bytes one batch holds in memory: payload, headers and type as the relay receives and sends them (not as Postgres stores them, compressed); a single larger row goes alone")
	durationVar(f, &o.cfg.BusyPollInterval, "busy-poll-interval", relay.DefaultBusyPollInterval, "after a batch that found rows, claim again this soon (doubling while nothing is found) to pick up events that sent no NOTIFY; negative turns it off")
	f.BoolVar(&o.cfg.PollOnly, "poll-only", false, "do not LISTEN (for PgBouncer/Supavisor in transaction mode)")
	f.BoolVar(&o.cfg.DisablePipelining, "no-pipelining", false, "claim the next batch only after the previous one committed, in a round trip of its own (by default it is claimed while a full batch is being published, and a small batch commits with the next claim)")
	f.IntVar(&o.pcfg.MaxMessageBytes, "max-message-bytes", 0, "largest record batch every topic accepts, instead of each topic's max.message.bytes as the broker reports it (0: ask the broker); larger records are held, not sent")
	durationVar(f, &o.cfg.HoldOut, "hold-out", relay.DefaultHoldOut, "how long an aggregate whose event failed for good (refused by the broker, undecodable) is skipped before its first retry; doubles per failure up to --max-hold-out")
	durationVar(f, &o.cfg.MaxHoldOut, "max-hold-out", relay.DefaultMaxHoldOut, "the longest a failed event's aggregate is skipped between retries ('outbox events retry' retries at once)")
	durationVar(f, &o.common.ShutdownTimeout, "shutdown-timeout", relay.DefaultShutdownTimeout, "how long the batch in flight may take to finish after SIGTERM")
	durationVar(f, &o.deliver, "delivery-timeout", kafka.DefaultDeliveryTimeout, "how long a batch waits for the broker before it is rolled back and retried with backoff")
	// --max-payload-bytes was the relay's own payload limit; the publisher
	// now learns each topic's, and the nearest meaning is an override of it.
	f.IntVar(&o.pcfg.MaxMessageBytes, "max-payload-bytes", 0, "deprecated: use --max-message-bytes")
	_ = f.MarkDeprecated("max-payload-bytes", "use --max-message-bytes, which limits the whole record and defaults to each topic's own limit")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the relay to this file until it exits, for 'go tool pprof' (default: none)")
	f.StringVar(&o.procs, "procs", procsAuto, "threads that run the relay's Go code at once (GOMAXPROCS): auto (one while it follows a trickle, which saves the CPU of waking threads on other cores; all of them from the first half second that drains a backlog), all (GOMAXPROCS, or every CPU), or a number")
	f.StringVar(&o.pcfg.Source, "source", "", "value of the event_source header, naming this outbox for consumers that read several (default: none)")
	f.StringVar(&o.sinkURL, "sink", "", "where to publish: a URL whose scheme picks the sink ("+schemeList()+"), e.g. kafka://host:9092; default: Kafka on --brokers (docs/sinks.md)")
	f.StringVar(&o.mode, "mode", "poll", "where events come from: poll (claim pending rows) or wal (stream a logical replication slot; experimental, see docs/wal.md)")
	f.BoolVar(&o.common.ExactlyOnce, "exactly-once", false, "publish each batch to Kafka in one transaction with the relay's progress, so that a read_committed consumer sees every event once through any crash (docs/exactly-once.md)")
	f.StringVar(&o.common.TransactionalID, "transactional-id", "", "with --exactly-once: the prefix of the relay's Kafka transactional ids, the same for every replica of this outbox and unique per outbox on the cluster (default: outbox/<schema>.<table>)")
	f.StringVar(&o.tx.ProgressTopic, "progress-topic", kafkapub.DefaultProgressTopic, "with --exactly-once: the compacted topic where each transaction records the relay's progress (created when missing)")
	durationVar(f, &o.cfg.LaneLease, "lane-lease", relay.DefaultLaneLease, "with --exactly-once and --mode poll: how long a relayer's lane lasts without renewal; a relayer that dies or pauses with a batch in flight holds that batch's aggregates back this long (up to about twice) before another relayer adopts its lane")
	durationVar(f, &o.tx.TransactionTimeout, "transaction-timeout", kafkapub.DefaultTransactionTimeout, "with --exactly-once: how long the broker lets a transaction stay open before it aborts it (bounds how long a relay that died mid-batch holds back read_committed consumers)")
	o.contracts.register(f, "each event of a type with a contract is checked before it is sent, and one that breaks it is held (reason contract; --mode wal: parked) until fixed and retried (docs/contracts.md)")
	o.ce.register(f)
	o.wal.register(f)
}

// relayProcess are the flags of `outbox relay` that no outbox has: which
// config file to read, and whether only to check it.
type relayProcess struct {
	config string
	check  bool
}

// runRelay runs `outbox relay` until its context is cancelled: the one
// outbox its flags name, or those of --config's file (relayspec.go), in
// one fleet (relayfleet.go) either way.
func runRelay(c *cobra.Command, g *globals, o *relayOptions, p *relayProcess) error {
	ctx := c.Context()
	if p.config == "" {
		if p.check {
			return errors.New("--check checks a config file: add --config FILE")
		}
		spec, err := flagSpec(ctx, g, o, c.Flags())
		if err != nil || spec == nil { // nil: a --mode wal action ran
			return err
		}
		log, err := g.logger()
		if err != nil {
			return err
		}
		return runFleet(ctx, g, o, []*outboxSpec{spec}, log, scrubber{})
	}
	for _, action := range []string{"setup-only", "teardown"} {
		if c.Flags().Changed(action) {
			return fmt.Errorf("--%s acts on one outbox: run it without --config, with that outbox's flags", action)
		}
	}
	file, err := readRelayFile(p.config, relayFileKeys(c), g.getenv)
	if err != nil {
		return err
	}
	scrub := newScrubber(file.env)
	g.stdout, g.stderr = scrub.Writer(g.stdout), scrub.Writer(g.stderr)
	specs, err := fileSpecs(c, g, file)
	if err != nil {
		return scrub.Error(err)
	}
	if p.check {
		printConfigCheck(g, file, specs, o)
		return nil
	}
	log, err := g.logger()
	if err != nil {
		return err
	}
	return scrub.Error(runFleet(ctx, g, o, specs, log, scrub))
}

// startCPUProfile profiles this process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// checkMode refuses an unknown --mode, and WAL flags that do not fit it:
// any of them with poll, more than one action with wal.
func (o *relayOptions) checkMode() error {
	switch o.mode {
	case "poll":
		return o.wal.onlyForWAL()
	case "wal":
		return o.wal.oneAction()
	default:
		return fmt.Errorf("--mode %q: use poll (the default) or wal", o.mode)
	}
}

// checkSink refuses the Kafka publisher's flags that cannot work.
func (o *relayOptions) checkSink() error {
	if o.deliver <= 0 {
		return errors.New("--delivery-timeout must be positive, e.g. 30s")
	}
	if o.pcfg.MaxMessageBytes < 0 {
		return fmt.Errorf("--max-message-bytes %d: use a positive size, or 0 to read each topic's limit from the broker", o.pcfg.MaxMessageBytes)
	}
	if len(o.pcfg.Source) > outbox.MaxSourceLen || pgtext.Invalid(o.pcfg.Source) != "" {
		return fmt.Errorf("--source: use at most %d bytes of UTF-8 text without NUL (producers size events for that)", outbox.MaxSourceLen)
	}
	return nil
}

// runPollRelay runs the polling relay with common, and the watchdog and
// cleanup jobs beside it, until ctx ends. listener, when not nil, is the
// LISTEN connection it shares with the other outboxes of its database.
func runPollRelay(ctx context.Context, o *relayOptions, common relay.Common, listener *relay.Listener) error {
	cfg := o.cfg
	cfg.Common, cfg.Listener = common, listener
	if err := o.ops.instrument(&cfg); err != nil {
		return err
	}
	r, err := relay.New(cfg)
	if err != nil {
		return err
	}
	// Check the schema before the watchdog and cleanup jobs start,
	// so an unmigrated table gives one clear error, not job warnings.
	if err := checkSchema(ctx, common.Pool, common.Tables); err != nil {
		return err
	}
	stopOps, err := o.ops.start(ctx, r)
	if err != nil {
		return err
	}
	defer stopOps()
	o.ops.running(r)
	defer o.startProcs(ctx, r, common)()
	return r.Run(ctx)
}

// check refuses the zeros that relay.New would silently turn into its
// defaults: "--batch-size 0" is a mistake, not a request for 5000. What
// else the sources refuse, their New says (Common.Validate).
func (o *relayOptions) check() error {
	for _, n := range []struct {
		flag string
		v    int
	}{
		{"--batch-size", o.common.BatchSize}, {"--max-batch-bytes", o.common.MaxBatchBytes}, {o.cleanupBatchFlag, o.ops.cfg.Cleanup.BatchSize},
	} {
		if n.v < 1 {
			return fmt.Errorf("%s %d: use a positive number", n.flag, n.v)
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--poll-interval", o.cfg.PollInterval}, {"--hold-out", o.cfg.HoldOut},
		{"--max-hold-out", o.cfg.MaxHoldOut}, {"--shutdown-timeout", o.common.ShutdownTimeout},
	} {
		if d.v <= 0 {
			return fmt.Errorf("%s %s: use a positive duration", d.flag, formatDays(d.v))
		}
	}
	if o.cfg.MaxHoldOut < o.cfg.HoldOut {
		return fmt.Errorf("--max-hold-out %s is below --hold-out %s: raise --max-hold-out or lower --hold-out", formatDays(o.cfg.MaxHoldOut), formatDays(o.cfg.HoldOut))
	}
	if o.cfg.BusyPollInterval == 0 {
		return errors.New("--busy-poll-interval 0: use a positive duration, or a negative one to turn it off")
	}
	if o.ops.cleanupInterval > 0 {
		return checkRetentions(o.ops.cfg.Cleanup.Retention, o.ops.processedRetention, o.ops.allowShort)
	}
	return nil
}
