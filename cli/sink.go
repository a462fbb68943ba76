package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// sinkEnv is what every sink is opened with, whatever its scheme: the
// relay's logger, the event_source to stamp (--source), and how long one
// batch may wait for the server (--delivery-timeout).
type sinkEnv struct {
	log     *slog.Logger
	source  string
	deliver time.Duration
	// kafka is the Kafka publisher's own flags (--max-message-bytes),
	// which only the Kafka sink reads.
	kafka kafkapub.PublisherConfig
	// ce is what --cloudevents stamps, nil without it.
	ce *cloudevents.Config
}

// openedSink is a sink ready for relay.Common.Sink. ping checks, before
// the relayer starts, that the server answers, with an error that says
// what to do; close releases its connections once the relayer stopped.
type openedSink struct {
	sink  relay.Sink
	ping  func(ctx context.Context) error
	close func()
}

// sinkOpener opens the sink a --sink URL of its scheme names. It refuses
// a URL it cannot use with an error that names --sink and says what to
// write instead, and never puts the URL's password in an error or a log.
type sinkOpener func(ctx context.Context, u *url.URL, env sinkEnv) (openedSink, error)

// sinkSchemes maps a --sink URL's scheme to its opener. Kafka is reached
// through --brokers (and the kafka scheme, for symmetry).
var sinkSchemes = map[string]sinkOpener{
	"kafka":  openKafkaURL,
	"nats":   openNATSURL,
	"redis":  openRedisURL,
	"rediss": openRedisURL,
	"http":   openWebhookURL,
	"https":  openWebhookURL,
	"amqp":   openAMQPURL, "amqps": openAMQPURL,
}

// parseSinkURL parses --sink's value and finds its opener.
func parseSinkURL(raw string) (*url.URL, sinkOpener, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return nil, nil, fmt.Errorf("--sink %q is not a URL; write scheme://host:port, with the scheme one of %s", redactURL(raw), schemeList())
	}
	open, ok := sinkSchemes[strings.ToLower(u.Scheme)]
	if !ok {
		return nil, nil, fmt.Errorf("--sink: unknown scheme %q; use one of %s", u.Scheme, schemeList())
	}
	return u, open, nil
}

func schemeList() string {
	names := make([]string, 0, len(sinkSchemes))
	for s := range sinkSchemes {
		names = append(names, s)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// redactURL is raw with any password replaced, for errors and logs.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		// Unparseable: keep only what cannot hold a secret.
		if i := strings.Index(raw, "@"); i >= 0 {
			return "…" + raw[i:]
		}
		return raw
	}
	return u.Redacted()
}

// openKafkaURL opens the Kafka sink for kafka://host:port[,host:port...],
// with the other Kafka settings left to their defaults: --brokers, with
// the TLS and SASL flags, is the full way to reach a cluster.
func openKafkaURL(_ context.Context, u *url.URL, env sinkEnv) (openedSink, error) {
	if u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return openedSink{}, errors.New("--sink kafka://host:port[,host:port] takes brokers only; for TLS or SASL use --brokers and the --tls and --sasl flags")
	}
	k := kafkaFlags{brokers: u.Host}
	cfg, err := k.brokersConfig(env.log)
	if err != nil {
		return openedSink{}, err
	}
	return openKafka(cfg, env)
}

// openKafka opens the Kafka sink on cfg's brokers.
func openKafka(cfg kafka.ClientConfig, env sinkEnv) (openedSink, error) {
	sink, client, err := kafkaSink(cfg, env.kafka, env.deliver, env.log)
	if err != nil {
		return openedSink{}, err
	}
	return openedSink{
		sink:  sink,
		ping:  func(ctx context.Context) error { return pingKafka(ctx, client, cfg.Brokers) },
		close: client.Close,
	}, nil
}

// kafkaOnlyFlags are the flags only the Kafka sink reads: given with
// another --sink, they would be ignored in silence.
var kafkaOnlyFlags = []string{"brokers", "tls", "tls-ca", "tls-cert", "tls-key", "tls-insecure",
	"sasl-mechanism", "sasl-user", "sasl-password", "max-message-bytes", "max-payload-bytes"}

// openSink opens the relay's sink: --sink's when given (refusing the
// Kafka flags beside a URL of another scheme), else Kafka on --brokers.
func (o *relayOptions) openSink(ctx context.Context, f *pflag.FlagSet, log *slog.Logger) (openedSink, error) {
	env := sinkEnv{log: log, source: o.pcfg.Source, deliver: o.deliver, kafka: o.pcfg, ce: o.ceCfg}
	env.kafka.CloudEvents = o.ceCfg
	if o.sinkURL == "" {
		kcfg, err := o.kf.brokersConfig(log)
		if err != nil {
			return openedSink{}, err
		}
		return openKafka(kcfg, env)
	}
	u, open, err := parseSinkURL(o.sinkURL)
	if err != nil {
		return openedSink{}, err
	}
	for _, name := range kafkaOnlyFlags {
		if f.Changed(name) && !(name == "max-message-bytes" && strings.EqualFold(u.Scheme, "kafka")) {
			return openedSink{}, fmt.Errorf("--%s is a Kafka flag, and --sink names a %s sink; drop --%s (with --sink, the URL says how to reach the sink)", name, u.Scheme, name)
		}
	}
	return open(ctx, u, env)
}
