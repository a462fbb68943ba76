package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/contracts/asyncapi"
	"github.com/pgoutbox/outbox/routing"
)

// asyncAPIOptions are the flags of `outbox contracts asyncapi`.
type asyncAPIOptions struct {
	contracts   contractsFlag
	sinkURL     string
	brokers     string
	topicPrefix string
	title       string
	version     string
	cloudEvents bool
	out         string
}

func newContractsAsyncAPICmd() *cobra.Command {
	var o asyncAPIOptions
	cmd := &cobra.Command{
		Use:   "asyncapi",
		Short: "Write an AsyncAPI 3.0.0 document of the events the relay publishes",
		Long: `asyncapi writes an AsyncAPI 3.0.0 document (JSON) describing what the relay
publishes for the contracted event types: one channel per destination the
sink routes a type to (--sink, or Kafka on --brokers; --topic-prefix as the
relay's), one message per type and version with its contract as payload
schema and the relay's headers, one send operation per channel. It
connects to nothing.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runContractsAsyncAPI(c, &o)
		},
	}
	f := cmd.Flags()
	o.contracts.register(f, "required")
	f.StringVar(&o.sinkURL, "sink", "", "the relay's --sink URL, for its routing and protocol (default: Kafka)")
	f.StringVar(&o.brokers, "brokers", "", "the Kafka brokers, host:port[,host:port], named as the document's server (default: none)")
	f.StringVar(&o.topicPrefix, "topic-prefix", "", "the relay's --topic-prefix")
	f.StringVar(&o.title, "title", "outbox events", "the document's title")
	f.StringVar(&o.version, "version", "1.0.0", "the document's version (of the API it describes)")
	f.BoolVar(&o.cloudEvents, "cloudevents", false, "describe the CloudEvents headers the relay adds with --cloudevents")
	f.StringVarP(&o.out, "file", "o", "", "write the document to this file (default: standard output)")
	return cmd
}

func runContractsAsyncAPI(c *cobra.Command, o *asyncAPIOptions) error {
	if o.contracts.dir == "" {
		return errors.New("--contracts is required: name the directory of the event contracts")
	}
	if o.sinkURL != "" && o.brokers != "" {
		return errors.New("--brokers names Kafka brokers, and --sink another sink; give one of them")
	}
	set, err := o.contracts.load()
	if err != nil {
		return err
	}
	opts, err := o.routing()
	if err != nil {
		return err
	}
	opts.Title, opts.Version = o.title, o.version
	doc, err := asyncapi.Build(set, os.DirFS(o.contracts.dir), opts)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if o.out == "" {
		_, err = c.OutOrStdout().Write(b)
		return err
	}
	if err := os.WriteFile(o.out, b, 0o644); err != nil {
		return fmt.Errorf("--file: %w", err)
	}
	return nil
}

// routing is the sink's routing and protocol, from --sink's scheme
// alone (nothing is dialed): what the relay with the same --sink and
// --topic-prefix routes each type to.
func (o *asyncAPIOptions) routing() (asyncapi.Options, error) {
	p := o.topicPrefix
	opts := asyncapi.Options{Protocol: "kafka", Routing: outbox.KafkaRouting{TopicPrefix: p}, AggregateHeader: true}
	var ce cloudevents.Binding
	var r interface{ Validate() error }
	if o.sinkURL == "" {
		if o.brokers != "" {
			opts.Host = strings.Split(o.brokers, ",")[0]
		}
		kr := outbox.KafkaRouting{TopicPrefix: p}
		opts.Routing, opts.AggregateHeader, ce, r = kr, false, cloudevents.Kafka, kr
	} else {
		u, _, err := parseSinkURL(o.sinkURL)
		if err != nil {
			return opts, err
		}
		opts.Host = u.Host
		switch scheme := strings.ToLower(u.Scheme); scheme {
		case "kafka":
			kr := outbox.KafkaRouting{TopicPrefix: p}
			opts.Routing, opts.AggregateHeader, ce, r = kr, false, cloudevents.Kafka, kr
		case "nats":
			nr := routing.NATS{TopicPrefix: p}
			opts.Protocol, opts.Routing, ce, r = "nats", nr, cloudevents.NATS, nr
		case "amqp", "amqps":
			ar := routing.AMQP{TopicPrefix: p}
			opts.Protocol, opts.Routing, ce, r = scheme, ar, cloudevents.AMQP, ar
		case "http", "https":
			wr := routing.Webhook{TopicPrefix: p}
			opts.Protocol, opts.Routing, ce, r = scheme, wr, cloudevents.HTTP, wr
		case "redis", "rediss":
			if o.cloudEvents {
				return opts, errors.New("--cloudevents: Redis Streams has no CloudEvents protocol binding, and the relay refuses --cloudevents there; drop it")
			}
			rr := routing.Redis{TopicPrefix: p}
			opts.Protocol, opts.Routing, r = "redis", rr, rr
		}
	}
	if err := r.Validate(); err != nil {
		return opts, fmt.Errorf("--topic-prefix: %w", err)
	}
	if o.cloudEvents {
		opts.CloudEvents = &ce
	}
	return opts, nil
}
