package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
)

// defaultConsumeName is the group and the consumer name of `outbox consume`
// when neither --group nor --name is given.
const defaultConsumeName = "outbox-consume"

// consumeOptions are the flags of `outbox consume`.
type consumeOptions struct {
	kf     kafkaFlags
	cfg    consumer.Config
	topics string
	output string
}

func newConsumeCmd(g *globals) *cobra.Command {
	var o consumeOptions
	cmd := &cobra.Command{
		Use:   "consume",
		Short: "Consume outbox events from Kafka once per consumer name, printing each as a JSON line",
		Long: `consume runs the idempotent Kafka group consumer (package consumer) on
--topics. Each event is recorded in the processed table under --name in the
transaction that handles it, so it is handled once per name however often
Kafka delivers it (relay retries, rebalances, restarts, a new --group).
Handling prints the event as one JSON line on stdout:

  {"event_id":42,"source":"","type":"order.placed","aggregate_id":"...",
   "topic":"order","partition":3,"offset":17,"payload":{...}}

Use it to watch a topic, to check delivery end to end, or as the template
of a consumer of your own; --output none prints nothing (load tests).

A line is written inside the transaction, before it commits: if the commit
then fails (the database went away), the event comes again and is printed
again. A new group starts at the topics' earliest offsets. Records that are
not outbox events (no event_id header, payload not JSON) go to <topic>.dlq.
SIGINT/SIGTERM finish the transaction in flight, commit offsets, leave the
group and exit 0.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runConsume(c.Context(), g, c.OutOrStdout(), &o)
		},
	}
	f := cmd.Flags()
	g.addDBFlags(f)
	o.kf.register(f)
	f.StringVar(&o.topics, "topics", "", "topics to read, comma-separated (the relay publishes type order.* to topic order, after its --topic-prefix); required")
	f.StringVar(&o.cfg.Group, "group", "", `Kafka consumer group (default: --name, else "`+defaultConsumeName+`")`)
	f.StringVar(&o.cfg.Name, "name", "", `consumer name recorded in the processed table: each name handles each event once (default: --group, else "`+defaultConsumeName+`")`)
	// 0, not the consumer's defaults: a --concurrency given sizes the pool,
	// else pgx's default does.
	f.IntVar(&o.cfg.BatchSize, "batch-size", 0, fmt.Sprintf("consecutive records of a partition handled in one transaction (0: the consumer's default, %d)", consumer.DefaultBatchSize))
	f.IntVar(&o.cfg.Concurrency, "concurrency", 0, fmt.Sprintf("partitions handled at once, each in its own transactions (0: the consumer's default, %d)", consumer.DefaultConcurrency))
	f.StringVar(&o.output, "output", "json", "json: one line per new event on stdout; none: print nothing")
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
	if o.cfg.BatchSize < 0 || o.cfg.Concurrency < 0 {
		return fmt.Errorf("--batch-size (%d) and --concurrency (%d): use a positive number, or 0 for the consumer's default", o.cfg.BatchSize, o.cfg.Concurrency)
	}
	if o.cfg.Topics, err = parseTopics(o.topics); err != nil {
		return err
	}
	p, err := newEventPrinter(out, o.output)
	if err != nil {
		return err
	}
	o.cfg.Name, o.cfg.Group = consumeNames(o.cfg.Name, o.cfg.Group)
	if o.cfg.Client, err = o.kf.brokersConfig(); err != nil {
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
	err = pingKafka(ctx, cl, o.cfg.Client.Brokers)
	cl.Close()
	if err != nil {
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
		if err := outbox.ValidateTopic(t); err != nil {
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
}

// eventPrinter is the handler of `outbox consume`: it writes each event as
// a JSON line, one write at a time (handlers of different partitions run
// concurrently with --concurrency).
type eventPrinter struct {
	w            io.Writer // nil for --output none
	onWriteError func()

	mu       sync.Mutex
	writeErr error
}

func newEventPrinter(w io.Writer, output string) (*eventPrinter, error) {
	switch output {
	case "json":
		return &eventPrinter{w: w}, nil
	case "none":
		return &eventPrinter{}, nil
	}
	return nil, fmt.Errorf("--output %q: use json (one line per event on stdout) or none (print nothing)", output)
}

func (p *eventPrinter) handle(_ context.Context, _ pgx.Tx, ev consumer.Event) error {
	if p.w == nil {
		return nil
	}
	var line bytes.Buffer
	enc := json.NewEncoder(&line)
	enc.SetEscapeHTML(false) // print payloads as they are, '<' and '&' included
	if err := enc.Encode(consumedEvent{
		EventID: ev.ID, Source: ev.Source, Type: ev.Type, AggregateID: ev.AggregateID,
		Topic: ev.Topic, Partition: ev.Partition, Offset: ev.Offset, Payload: ev.Payload,
	}); err != nil {
		return consumer.Permanent(err) // the consumer has checked the payload is JSON: not reached
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

func (p *eventPrinter) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.writeErr
}
