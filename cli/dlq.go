package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox/consumer/dlq"
	"github.com/pgoutbox/outbox/internal/clip"
)

// dlqOptions are the flags of `outbox dlq list` and `outbox dlq replay`.
type dlqOptions struct {
	kf       kafkaFlags
	sinkURL  string
	dest     string
	filter   dlq.Filter
	ids      []string
	timeout  time.Duration
	asJSON   bool
	yes      bool
	showBody bool
}

func newDLQCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect dead letters and send them back once their cause is fixed",
		Long: `dlq lists the messages a consumer dead-lettered (malformed, or whose handler
failed every attempt) and sends them back to the topic they were consumed
from. A dead letter is not recorded as processed, so a replayed event is
processed once; one processed meanwhile is skipped as a duplicate. Fix the
cause first (deploy the handler that takes it), then replay.

--topic names where the dead letters are: on Kafka (the default, on
--brokers) the dead-letter topic, <topic>.dlq by default; with --sink, in
that broker's words (docs/sinks/<sink>.md says what each consumer writes
and whether replay removes what it sent back). A replayed event goes to
its aggregate's partition or lane, but after the events the consumer
processed since: per-aggregate order does not hold for a replayed event.`,
	}
	groupOnly(cmd)
	cmd.AddCommand(newDLQListCmd(g), newDLQReplayCmd(g))
	return cmd
}

func (o *dlqOptions) register(cmd *cobra.Command) {
	f := cmd.Flags()
	o.kf.register(f)
	f.StringVar(&o.sinkURL, "sink", "", "the broker, as 'outbox consume --sink' takes it ("+dlqSchemeList()+"); default: Kafka on --brokers")
	f.StringVar(&o.dest, "topic", "", "the dead-letter destination: a Kafka topic (order.dlq), a Redis stream (order:dlq), a RabbitMQ queue (billing.dlq), a NATS stream (required)")
	f.StringVar(&o.filter.Consumer, "consumer", "", "only the dead letters of this consumer name")
	f.StringSliceVar(&o.ids, "event-id", nil, "only these events (comma-separated ids, or the flag repeated)")
	durationVar(f, &o.timeout, "timeout", 30*time.Second, "give up reading the dead letters after this long")
}

func newDLQListCmd(g *globals) *cobra.Command {
	var o dlqOptions
	cmd := &cobra.Command{
		Use:   "list --topic T",
		Short: "List the dead letters of a dead-letter topic",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runDLQ(c.Context(), g, &o, printLetters)
		},
	}
	o.register(cmd)
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print JSON for scripts")
	cmd.Flags().BoolVar(&o.showBody, "payload", false, "print each dead letter's payload too")
	return cmd
}

func newDLQReplayCmd(g *globals) *cobra.Command {
	var o dlqOptions
	cmd := &cobra.Command{
		Use:   "replay --topic T [--consumer NAME] [--event-id N]",
		Short: "Send dead letters back to the topic they were consumed from",
		Long: `replay sends the dead letters --topic holds (with --consumer and --event-id,
only those) back to the topic each was consumed from, in order, with its
key, payload and headers, and waits for the broker to acknowledge each.
On Kafka the dead letters stay in the dead-letter topic: replaying one
twice is harmless, consumers skip it as a duplicate. On RabbitMQ replay
removes each dead letter from its queue once the server confirmed it.
A dead letter that lost its payload (a pointer record) cannot be sent
back: replay that event from the outbox ('outbox events replay').

Without --yes, replay lists what it would send and sends nothing.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runDLQ(c.Context(), g, &o, replayLetters)
		},
	}
	o.register(cmd)
	cmd.Flags().BoolVar(&o.yes, "yes", false, "send them (without it: a dry run)")
	return cmd
}

// runDLQ reads the dead letters o selects and hands them to act.
func runDLQ(ctx context.Context, g *globals, o *dlqOptions, act func(context.Context, *globals, *dlqOptions, dlq.Store, []dlq.Letter) error) error {
	log, err := g.logger()
	if err != nil {
		return err
	}
	if o.dest == "" {
		return errors.New("--topic is required: where the dead letters are, e.g. order.dlq (a Kafka dead-letter topic; see --sink for the others)")
	}
	for _, s := range o.ids {
		id, err := parseEventID(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--event-id: %w", err)
		}
		o.filter.EventIDs = append(o.filter.EventIDs, id)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %s: use a positive duration", o.timeout)
	}
	store, err := o.openStore(log)
	if err != nil {
		return err
	}
	defer store.Close()
	rctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	letters, err := store.List(rctx, o.dest)
	if err != nil {
		return err
	}
	return act(ctx, g, o, store, o.filter.Apply(letters))
}

// dlqStoreOpener opens the dead letters of the broker a --sink URL of its
// scheme names.
type dlqStoreOpener func(u *url.URL, log *slog.Logger) (dlq.Store, error)

// dlqSchemes maps --sink schemes to their dead-letter stores; Kafka's is
// the default, on --brokers.
var dlqSchemes = map[string]dlqStoreOpener{
	"amqp":   openAMQPDeadLetters,
	"amqps":  openAMQPDeadLetters,
	"nats":   openNATSDeadLetters,
	"redis":  openRedisDLQ,
	"rediss": openRedisDLQ,
}

func dlqSchemeList() string {
	names := []string{"kafka"}
	for s := range dlqSchemes {
		names = append(names, s)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// openStore opens the dead letters of --sink, else of Kafka on --brokers.
func (o *dlqOptions) openStore(log *slog.Logger) (dlq.Store, error) {
	if o.sinkURL != "" {
		u, err := url.Parse(o.sinkURL)
		if err != nil || u.Scheme == "" {
			return nil, fmt.Errorf("--sink %q is not a URL; write scheme://host:port, with the scheme one of %s", redactURL(o.sinkURL), dlqSchemeList())
		}
		scheme := strings.ToLower(u.Scheme)
		if scheme == "kafka" {
			o.kf.brokers = u.Host
		} else {
			open, ok := dlqSchemes[scheme]
			if !ok {
				return nil, fmt.Errorf("--sink: unknown scheme %q for dead letters; use one of %s", u.Scheme, dlqSchemeList())
			}
			return open(u, log)
		}
	}
	kcfg, err := o.kf.brokersConfig(log)
	if err != nil {
		return nil, err
	}
	return dlq.NewKafka(kcfg)
}

// printLetters prints letters as a table, or as JSON.
func printLetters(_ context.Context, g *globals, o *dlqOptions, _ dlq.Store, letters []dlq.Letter) error {
	if o.asJSON {
		out := make([]map[string]any, 0, len(letters))
		for _, l := range letters {
			out = append(out, letterJSON(l))
		}
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(letters) == 0 {
		fmt.Fprintf(g.stdout, "no dead letters in %s%s\n", clip.Field(o.dest), filterNote(o.filter))
		return nil
	}
	w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "POSITION\tEVENT\tTYPE\tCONSUMER\tATTEMPTS\tFROM\tERROR")
	for _, l := range letters {
		id := "-"
		if l.EventID > 0 {
			id = strconv.FormatInt(l.EventID, 10)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", l.Position, id, dash(clipOrEmpty(l.Type)), dash(clipOrEmpty(l.Consumer)),
			l.Attempts, dash(clipOrEmpty(l.OriginalTopic)), dash(clip.Text(oneLine(l.Error), 200)))
		if o.showBody {
			fmt.Fprintf(w, "\tpayload:\t%s\n", clip.PrintableJSON(string(l.Payload)))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "%d dead letters%s; 'outbox dlq replay --topic %s' sends them back\n", len(letters), filterNote(o.filter), o.dest)
	return nil
}

// clipOrEmpty is clip.Field, or "" for an empty value (dash shows it).
func clipOrEmpty(s string) string {
	if s == "" {
		return ""
	}
	return clip.Field(s)
}

func filterNote(f dlq.Filter) string {
	var parts []string
	if f.Consumer != "" {
		parts = append(parts, "consumer "+clip.Field(f.Consumer))
	}
	if len(f.EventIDs) > 0 {
		parts = append(parts, fmt.Sprintf("%d event ids", len(f.EventIDs)))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (of " + strings.Join(parts, ", ") + ")"
}

// letterJSON is the --json shape: snake_case keys; the payload as JSON
// when it is, else as text.
func letterJSON(l dlq.Letter) map[string]any {
	headers := make(map[string]string, len(l.Headers))
	for _, h := range l.Headers {
		if _, seen := headers[h.Key]; !seen {
			headers[h.Key] = h.Value
		}
	}
	var payload any = string(l.Payload)
	if json.Valid(l.Payload) {
		payload = json.RawMessage(l.Payload)
	}
	return map[string]any{
		"destination": l.Destination, "position": l.Position, "original_topic": l.OriginalTopic,
		"event_id": l.EventID, "type": l.Type, "source": l.Source, "consumer": l.Consumer,
		"attempts": l.Attempts, "error": l.Error, "key": string(l.Key), "headers": headers,
		"payload": payload, "value_dropped": l.ValueDropped, "headers_dropped": l.HeadersDropped,
	}
}

// replayLetters sends letters back, or with no --yes says what it would.
func replayLetters(ctx context.Context, g *globals, o *dlqOptions, store dlq.Store, letters []dlq.Letter) error {
	if len(letters) == 0 {
		fmt.Fprintf(g.stdout, "no dead letters in %s%s: nothing to replay\n", clip.Field(o.dest), filterNote(o.filter))
		return nil
	}
	to := map[string]int{}
	for _, l := range letters {
		if err := l.Replayable(); err != nil {
			return fmt.Errorf("%w (leave it out with --event-id, or --consumer)", err)
		}
		to[l.OriginalTopic]++
	}
	var dests []string
	for t, n := range to {
		dests = append(dests, fmt.Sprintf("%d to %s", n, clip.Field(t)))
	}
	slices.Sort(dests)
	if !o.yes {
		fmt.Fprintf(g.stdout, "would send %d dead letters back: %s\n", len(letters), strings.Join(dests, ", "))
		dryRunNote(g, "send them")
		return nil
	}
	sent, err := store.Replay(ctx, letters)
	fmt.Fprintf(g.stdout, "sent %d of %d dead letters back\n", sent, len(letters))
	return err
}
