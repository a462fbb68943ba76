package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"

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
	// tx, with --exactly-once, configures the Kafka sink's transactions
	// (its Client is filled in by openKafka); nil without it.
	tx *kafkapub.TxConfig
	// conns, when not nil, holds the connections the outboxes of the
	// process share: an opener that can share its client gets it there,
	// under key (sinkKey), instead of dialling its own.
	conns *sinkConns
	key   string
}

// sinkConns are the sink clients the outboxes of one relay process share:
// one per distinct sink setting (sinkKey), opened by the first outbox
// that asks for it and closed with the last. users counts, before any is
// opened, how many outboxes will use each key: a Kafka client that
// several share is built for sharing (kafkapub.NewSharedPublisherClient).
type sinkConns struct {
	mu    sync.Mutex
	users map[string]int
	open  map[string]*sharedConn
	// log is the process's logger, for what a shared client logs: it
	// serves more than the outbox that opened it.
	log *slog.Logger
}

type sharedConn struct {
	v     any
	refs  int
	close func()
}

func newSinkConns(log *slog.Logger) *sinkConns {
	return &sinkConns{users: map[string]int{}, open: map[string]*sharedConn{}, log: log}
}

// clientLog is the logger of the client env's sink opens: the process's
// when the client is shared, else the outbox's.
func (env sinkEnv) clientLog() *slog.Logger {
	if env.conns != nil && env.key != "" && env.conns.log != nil {
		return env.conns.log
	}
	return env.log
}

// want counts one more outbox that will use key.
func (s *sinkConns) want(key string) {
	if s != nil && key != "" {
		s.users[key]++
	}
}

// sharedBy is how many outboxes will use key.
func (s *sinkConns) sharedBy(key string) int {
	if s == nil || key == "" {
		return 1
	}
	return max(s.users[key], 1)
}

// get returns the client of key, dialling it the first time; release
// closes it once every outbox that got it released it. Without s or a
// key, it dials a client of the caller's own.
func (s *sinkConns) get(key string, dial func() (any, func(), error)) (v any, release func(), err error) {
	if s == nil || key == "" {
		v, closeFn, err := dial()
		return v, closeFn, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.open[key]
	if !ok {
		v, closeFn, err := dial()
		if err != nil {
			return nil, nil, err
		}
		c = &sharedConn{v: v, close: closeFn}
		s.open[key] = c
	}
	c.refs++
	var once sync.Once
	return c.v, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if c.refs--; c.refs == 0 {
				delete(s.open, key)
				c.close()
			}
		})
	}, nil
}

// sinkKey names the client an outbox's sink settings need, equal for
// two outboxes exactly when one client can serve both: for Kafka, the
// brokers and their TLS and SASL settings, --delivery-timeout and
// --max-message-bytes (a client's, not a publisher's); for NATS the
// --sink URL; for Redis the URL and --delivery-timeout (the client's
// timeouts). "" for the sinks that open a connection per publisher
// (RabbitMQ: a channel in confirm mode each; webhooks: plain HTTP).
// Never printed: it holds the SASL password.
func (o *relayOptions) sinkKey() string {
	scheme := "kafka"
	if o.sinkURL != "" {
		u, err := url.Parse(o.sinkURL)
		if err != nil {
			return ""
		}
		scheme = strings.ToLower(u.Scheme)
	}
	switch scheme {
	case "kafka":
		cfg := o.kf.config()
		if o.sinkURL != "" {
			u, _ := url.Parse(o.sinkURL)
			k := kafkaFlags{brokers: u.Host}
			cfg = k.config()
		}
		return fmt.Sprintf("kafka %q %t %q %q %q %t %q %q %q %s %d", cfg.Brokers, cfg.TLS, cfg.CAFile, cfg.CertFile, cfg.KeyFile,
			cfg.TLSInsecureSkipVerify, cfg.SASLMechanism, cfg.SASLUser, cfg.SASLPassword, o.deliver, o.pcfg.MaxMessageBytes)
	case "nats":
		return "nats " + o.sinkURL
	case "redis", "rediss":
		return fmt.Sprintf("redis %s %s", o.sinkURL, o.deliver)
	}
	return ""
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

// openKafka opens the Kafka sink on cfg's brokers: a publisher on a
// client of its own, or on the one it shares with the process's other
// outboxes of the same settings (env.conns).
func openKafka(cfg kafka.ClientConfig, env sinkEnv) (openedSink, error) {
	shared := env.conns.sharedBy(env.key) > 1
	v, release, err := env.conns.get(env.key, func() (any, func(), error) {
		client, err := kafkaClient(cfg, env.deliver, env.clientLog(), shared)
		if err != nil {
			return nil, nil, err
		}
		return client, client.Close, nil
	})
	if err != nil {
		return openedSink{}, err
	}
	client := v.(*kgo.Client)
	pcfg := env.kafka
	pcfg.Logger = env.log
	var sink relay.Sink = kafkapub.NewPublisher(client, pcfg)
	if env.tx != nil {
		tcfg := *env.tx
		tcfg.Client = cfg
		tcfg.Client.Opts = append(slices.Clone(cfg.Opts), kgo.RecordDeliveryTimeout(env.deliver))
		tcfg.Client.Logger = env.clientLog()
		tx, err := kafkapub.NewTxPublisher(client, pcfg, tcfg)
		if err != nil {
			release()
			return openedSink{}, err
		}
		sink = tx
	}
	return openedSink{
		sink:  sink,
		ping:  func(ctx context.Context) error { return pingKafka(ctx, client, cfg.Brokers) },
		close: release,
	}, nil
}

// kafkaOnlyFlags are the flags only the Kafka sink reads: given with
// another --sink, they would be ignored in silence.
var kafkaOnlyFlags = []string{"brokers", "tls", "tls-ca", "tls-cert", "tls-key", "tls-insecure",
	"sasl-mechanism", "sasl-user", "sasl-password", "max-message-bytes", "max-payload-bytes"}

// openSink opens the relay's sink: --sink's when given (refusing the
// Kafka flags beside a URL of another scheme), else Kafka on --brokers.
// conns, when not nil, holds the clients the process's outboxes share.
func (o *relayOptions) openSink(ctx context.Context, f *pflag.FlagSet, log *slog.Logger, conns *sinkConns) (openedSink, error) {
	env := sinkEnv{log: log, source: o.pcfg.Source, deliver: o.deliver, kafka: o.pcfg, ce: o.ceCfg, conns: conns, key: o.sinkKey()}
	if o.common.ExactlyOnce {
		env.tx = &o.tx
	}
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
	if err := o.checkSinkFlags(f); err != nil {
		return openedSink{}, err
	}
	return open(ctx, u, env)
}

// checkSinkFlags refuses --sink's URL when it is none, and the Kafka
// flags beside a --sink of another scheme: set on f, they would be
// ignored in silence.
func (o *relayOptions) checkSinkFlags(f *pflag.FlagSet) error {
	if o.sinkURL == "" {
		_, err := o.kf.brokersConfig(nil)
		return err
	}
	u, _, err := parseSinkURL(o.sinkURL)
	if err != nil {
		return err
	}
	for _, name := range kafkaOnlyFlags {
		if f.Changed(name) && !(name == "max-message-bytes" && strings.EqualFold(u.Scheme, "kafka")) {
			return fmt.Errorf("--%s is a Kafka flag, and --sink names a %s sink; drop --%s (with --sink, the URL says how to reach the sink)", name, u.Scheme, name)
		}
	}
	return nil
}
