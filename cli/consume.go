package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/consumermetrics"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/internal/kafkatopic"
)

// defaultConsumeName is the group and the consumer name of `outbox consume`
// when neither --group nor --name is given.
const defaultConsumeName = "outbox-consume"

// consumeOptions are the flags of `outbox consume`.
type consumeOptions struct {
	kf       kafkaFlags
	cfg      consumer.Config
	topics   string
	asJSON   bool
	quiet    bool
	output   string // deprecated --output json|none
	httpAddr string
	// sinkURL is --sink: a transport other than Kafka on --brokers
	// (consume_sink.go).
	sinkURL string
	// contracts is --contracts: each event is checked against its
	// contract before it is recorded, and dead-lettered when it breaks it.
	contracts contractsFlag
}

func newConsumeCmd(g *globals) *cobra.Command {
	var o consumeOptions
	cmd := &cobra.Command{
		Use:   "consume",
		Short: "Consume outbox events from Kafka once per consumer name, recording each as processed",
		Long: `consume runs the idempotent Kafka group consumer (package consumer) on
--topics, as the template of a consumer of your own or to check delivery end
to end. It is a consumer, not a read-only viewer: it writes.

  - Each event is recorded in the processed table (a dedupe row under
    --name) in the transaction that handles it, so it is handled once per
    name however often Kafka delivers it (relay retries, rebalances,
    restarts, a new --group). Retention cleanup deletes those rows after
    --processed-retention (30 days).
  - It commits the group's offsets.
  - A record it cannot handle (no event_id header, payload not JSON where
    its content-type header says JSON or is absent) is dead-lettered: written to <topic>.dlq, a topic the broker creates if it
    allows auto-creation.

To watch a topic without writing anything, read it with kcat:

  kcat -C -b 127.0.0.1:9092 -t order -f '%p %o %k %h %s\n'

Each event handled is printed on stdout, one line per event:

  event 42 order.placed aggregate=... topic=order partition=3 offset=17 payload={...}

(a payload over 500 bytes is cut short; --json prints it whole). --json
prints one JSON object per line instead:

  {"event_id":42,"source":"","type":"order.placed","aggregate_id":"...",
   "topic":"order","partition":3,"offset":17,"payload":{...}}

A binary payload (its content type not JSON) is shown as its content type
and its bytes in hex on a text line, and with --json as "payload":null,
"content_type" and "payload_base64".

--quiet prints nothing (load tests). --http host:port serves /metrics
(outbox_consumer_processed_total, _duplicates_total, _dead_letters_total,
... labelled consumer=<name>) and /healthz.

A line is written inside the transaction, before it commits: if the commit
then fails (the database went away), the event comes again and is printed
again. A new group starts at the topics' earliest offsets.
SIGINT/SIGTERM finish the transaction in flight, commit offsets, leave the
group and exit 0.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			u, open, err := o.sinkConsumer(c.Flags())
			if err != nil {
				return err
			}
			if open != nil {
				return runSinkConsume(c.Context(), g, c.OutOrStdout(), &o, u, open)
			}
			return runConsume(c.Context(), g, c.OutOrStdout(), &o)
		},
	}
	f := cmd.Flags()
	g.addDBFlags(f)
	o.kf.register(f)
	f.StringVar(&o.sinkURL, "sink", "", "what to consume: a URL whose scheme picks the transport (kafka, "+consumeSchemeList()+"), e.g. redis://127.0.0.1:6379/0 or http://127.0.0.1:8080/outbox (a webhook endpoint to serve); default: Kafka on --brokers (docs/sinks.md)")
	f.StringVar(&o.topics, "topics", "", "topics to read, comma-separated (the relay publishes type order.* to topic order, after its --topic-prefix); required")
	f.StringVar(&o.cfg.Group, "group", "", `Kafka consumer group (default: --name, else "`+defaultConsumeName+`")`)
	f.StringVar(&o.cfg.Name, "name", "", `consumer name recorded in the processed table: each name handles each event once (default: --group, else "`+defaultConsumeName+`")`)
	// 0, not the consumer's defaults: a --concurrency given sizes the pool,
	// else pgx's default does.
	f.IntVar(&o.cfg.BatchSize, "batch-size", 0, fmt.Sprintf("consecutive records of a partition handled in one transaction (0: the consumer's default, %d)", consumer.DefaultBatchSize))
	f.IntVar(&o.cfg.Concurrency, "concurrency", 0, fmt.Sprintf("partitions handled at once, each in its own transactions (0: the consumer's default, %d)", consumer.DefaultConcurrency))
	f.BoolVar(&o.asJSON, "json", false, "print each event as one JSON line instead of a line of text")
	f.BoolVar(&o.quiet, "quiet", false, "print nothing (load tests); events are still recorded as processed")
	f.StringVar(&o.httpAddr, "http", "", "serve /metrics (with the group's lag per partition), /healthz and /readyz (database and broker) on host:port (a bare :port binds 127.0.0.1); off when empty")
	o.contracts.register(f, "each event is checked against its type's contract (the version in its event_version header, else the latest) and dead-lettered, with the pointer and the rule it breaks, when it breaks it")
	f.StringVar(&o.output, "output", "", "json: as --json; none: as --quiet")
	_ = f.MarkDeprecated("output", "use --json or --quiet") // warned on stderr: NewRoot's warnOnStderr
	return cmd
}

// runConsume runs the consumer o describes, printing events to out, until
// ctx is cancelled.
func runConsume(ctx context.Context, g *globals, out io.Writer, o *consumeOptions) error {
	log, err := g.logger()
	if err != nil {
		return err
	}
	t, err := g.tables()
	if err != nil {
		return err
	}
	p, err := o.prepare(out, log)
	if err != nil {
		return err
	}
	opts, err := o.cfg.Client.Options()
	if err != nil {
		return err
	}
	// One connection per partition processed at once, and one for
	// the consumer's outage checks; pgx's default (4 or more)
	// covers the default concurrency of 1.
	var conns int32
	if o.cfg.Concurrency > 0 {
		conns = int32(o.cfg.Concurrency) + 1
	}
	pool, err := g.connect(ctx, conns)
	if err != nil {
		return err
	}
	defer pool.Close()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	// The client stays open for --http: the group's lag and /readyz's
	// broker check, beside the consumer's own client.
	defer cl.Close()
	if err := pingKafka(ctx, cl, o.cfg.Client.Brokers); err != nil {
		return err
	}
	o.cfg.Pool = pool
	o.cfg.Tables = t
	o.cfg.Logger = log
	o.cfg.DefaultHandler = p.handle
	cons, err := consumer.New(o.cfg)
	if err != nil {
		return err
	}
	if err := checkSchema(ctx, pool, t); err != nil {
		return err
	}
	if o.httpAddr != "" {
		stopHTTP, err := o.serveHTTP(cons, pool, cl, log)
		if err != nil {
			return err
		}
		// Deferred: /metrics answers until the consumer has stopped.
		defer stopHTTP()
	}

	return runConsumer(ctx, cons, p, log)
}

// prepare checks and completes the flags' consumer configuration (topics,
// names, the Kafka client) and returns the printer of the events.
func (o *consumeOptions) prepare(out io.Writer, log *slog.Logger) (*eventPrinter, error) {
	p, err := o.prepareOutput(out)
	if err != nil {
		return nil, err
	}
	if o.cfg.Topics, err = parseTopics(o.topics); err != nil {
		return nil, err
	}
	o.cfg.Name, o.cfg.Group = consumeNames(o.cfg.Name, o.cfg.Group)
	if o.cfg.Client, err = o.kf.brokersConfig(log); err != nil {
		return nil, err
	}
	o.cfg.Client.Logger = log.With("consumer", o.cfg.Name)
	return p, nil
}

// prepareOutput checks the flags every transport shares (sizes, output,
// --http) and returns the printer of the events.
func (o *consumeOptions) prepareOutput(out io.Writer) (*eventPrinter, error) {
	if o.cfg.BatchSize < 0 || o.cfg.Concurrency < 0 {
		return nil, fmt.Errorf("--batch-size (%d) and --concurrency (%d): use a positive number, or 0 for the consumer's default", o.cfg.BatchSize, o.cfg.Concurrency)
	}
	format, err := consumeFormat(o.asJSON, o.quiet, o.output)
	if err != nil {
		return nil, err
	}
	if o.httpAddr != "" {
		if o.httpAddr, err = loopbackDefault(o.httpAddr); err != nil {
			return nil, err
		}
	}
	set, err := o.contracts.load()
	if err != nil {
		return nil, err
	}
	if set != nil {
		o.cfg.Middleware = append(o.cfg.Middleware, consumer.CheckContracts(set))
	}
	return &eventPrinter{w: out, format: format}, nil
}

// runConsumer runs cons until ctx ends or p fails to write, then logs its
// counters.
func runConsumer(ctx context.Context, cons *consumer.Consumer, p *eventPrinter, log *slog.Logger) error {
	// A failed write stops the consumer rather than failing the
	// handler: retried, the event would end up dead-lettered for
	// a local problem. Its transaction rolls back, so the event
	// stays unprocessed for the next run.
	run, stop := context.WithCancel(ctx)
	defer stop()
	p.onWriteError = stop
	if err := cons.Run(run); err != nil {
		return err
	}
	st := cons.Stats()
	log.Info("consume stopped", "processed", st.Processed, "duplicates", st.Duplicates,
		"dead_lettered", st.DeadLettered, "malformed", st.Malformed, "retries", st.Retries)
	return p.err()
}

// serveHTTP serves --http: the consumer's counters, its group's lag per
// partition (read through cl, a client of the consumer's cluster) and
// readiness over the database and the broker.
func (o *consumeOptions) serveHTTP(cons *consumer.Consumer, pool *pgxpool.Pool, cl *kgo.Client, log *slog.Logger) (stop func(), err error) {
	m := consumermetrics.New(o.cfg.Name, cons.Stats)
	m.WatchLag(o.cfg.Group, kadm.NewClient(cl))
	h := m.Handler(consumermetrics.ReadyCheck{Name: "database", Check: pool.Ping}, consumermetrics.ReadyCheck{Name: "broker", Check: cl.Ping})
	_, stop, err = serveHTTP(o.httpAddr, h, log, "/metrics /healthz /readyz")
	return stop, err
}

// consumeNames fills in the group and the consumer name from each other.
// Either one alone names both, so two runs with different names never
// share a group (and split its partitions between them).
func consumeNames(name, group string) (string, string) {
	switch {
	case name == "" && group == "":
		return defaultConsumeName, defaultConsumeName
	case name == "":
		return group, group
	case group == "":
		return name, name
	}
	return name, group
}

func parseTopics(s string) ([]string, error) {
	var topics []string
	for t := range strings.SplitSeq(s, ",") {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		if err := kafkatopic.Validate(t); err != nil {
			return nil, fmt.Errorf("--topics holds %s", err)
		}
		topics = append(topics, t)
	}
	if len(topics) == 0 {
		return nil, errors.New("no topics: pass --topics with the topics to read, comma-separated, e.g. --topics order,payment (events of type order.* are on topic order, after the relay's --topic-prefix)")
	}
	return topics, nil
}

// consumedEvent is the JSON line `outbox consume` prints per event.
type consumedEvent struct {
	EventID     int64           `json:"event_id"`
	Source      string          `json:"source"`
	Type        string          `json:"type"`
	AggregateID uuid.UUID       `json:"aggregate_id"`
	Topic       string          `json:"topic"`
	Partition   int32           `json:"partition"`
	Offset      int64           `json:"offset"`
	Payload     json.RawMessage `json:"payload"`
	// ContentType and PayloadBase64 are set for a binary payload (a
	// content type that is not JSON), whose bytes are base64 in
	// payload_base64 and payload is null.
	ContentType   string  `json:"content_type,omitempty"`
	PayloadBase64 *string `json:"payload_base64,omitempty"`
}

// Output formats of `outbox consume`.
const (
	formatText  = "text"
	formatJSON  = "json"
	formatQuiet = "quiet"
)

// consumeFormat picks the output format from --json, --quiet and the
// deprecated --output.
func consumeFormat(asJSON, quiet bool, output string) (string, error) {
	switch output {
	case "":
	case "json":
		asJSON = true
	case "none":
		quiet = true
	default:
		return "", fmt.Errorf("--output %q: use --json (one JSON line per event) or --quiet (print nothing); --output is deprecated", output)
	}
	switch {
	case asJSON && quiet:
		return "", errors.New("--json and --quiet (or --output) contradict each other: pick one")
	case asJSON:
		return formatJSON, nil
	case quiet:
		return formatQuiet, nil
	}
	return formatText, nil
}

// maxTextPayload is how much of a payload a text line shows.
const maxTextPayload = 500

// eventPrinter is the handler of `outbox consume`: it writes each event as
// a line, one write at a time (handlers of different partitions run
// concurrently with --concurrency).
type eventPrinter struct {
	w            io.Writer
	format       string
	onWriteError func()

	mu       sync.Mutex
	writeErr error
}

func (p *eventPrinter) handle(_ context.Context, _ pgx.Tx, ev consumer.Event) error {
	var line bytes.Buffer
	switch p.format {
	case formatQuiet:
		return nil
	case formatJSON:
		enc := json.NewEncoder(&line)
		enc.SetEscapeHTML(false) // print payloads as they are, '<' and '&' included
		out := consumedEvent{
			EventID: ev.ID, Source: ev.Source, Type: ev.Type, AggregateID: ev.AggregateID,
			Topic: ev.Topic, Partition: ev.Partition, Offset: ev.Offset, Payload: ev.Payload,
		}
		if !outbox.IsJSONContentType(ev.ContentType) && ev.ContentType != "" {
			b64 := base64.StdEncoding.EncodeToString(ev.Payload)
			out.Payload, out.ContentType, out.PayloadBase64 = json.RawMessage("null"), ev.ContentType, &b64
		}
		if err := enc.Encode(out); err != nil {
			return consumer.Permanent(err) // the consumer has checked a JSON payload is JSON: not reached
		}
	default:
		writeTextLine(&line, ev)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.writeErr != nil {
		return p.writeErr
	}
	if _, err := p.w.Write(line.Bytes()); err != nil {
		p.writeErr = fmt.Errorf("write event %d to stdout: %w; it was not recorded as processed and comes again on the next run", ev.ID, err)
		if p.onWriteError != nil {
			p.onWriteError()
		}
		return p.writeErr
	}
	return nil
}

// writeTextLine writes ev as one line of text: type and source are
// quoted when they hold spaces or control characters, the payload is
// compacted to one line and cut after maxTextPayload bytes.
func writeTextLine(b *bytes.Buffer, ev consumer.Event) {
	fmt.Fprintf(b, "event %d %s", ev.ID, clip.Field(ev.Type))
	if ev.Source != "" {
		fmt.Fprintf(b, " source=%s", clip.Field(ev.Source))
	}
	fmt.Fprintf(b, " aggregate=%s topic=%s partition=%d offset=%d payload=", ev.AggregateID, ev.Topic, ev.Partition, ev.Offset)
	var payload bytes.Buffer
	if ev.ContentType != "" && !outbox.IsJSONContentType(ev.ContentType) {
		// A binary payload: its content type, and its bytes in hex.
		fmt.Fprintf(&payload, "(%s) \\x%x", clip.Field(ev.ContentType), ev.Payload)
	} else if err := json.Compact(&payload, ev.Payload); err != nil {
		payload.Reset()
		payload.WriteString(strconv.Quote(string(ev.Payload))) // the consumer has checked it is JSON: not reached
	} else if s := clip.PrintableJSON(payload.String()); s != payload.String() {
		payload.Reset()
		payload.WriteString(s) // the same JSON, with what a terminal acts on escaped
	}
	if payload.Len() <= maxTextPayload {
		b.Write(payload.Bytes())
	} else {
		cut := maxTextPayload
		for cut > 0 && !utf8.RuneStart(payload.Bytes()[cut]) {
			cut--
		}
		b.Write(payload.Bytes()[:cut])
		fmt.Fprintf(b, "... (%d bytes; --json prints it whole)", payload.Len())
	}
	b.WriteByte('\n')
}

func (p *eventPrinter) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.writeErr
}
