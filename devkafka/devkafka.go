// Package devkafka is an embedded, Kafka-wire-compatible, single-node
// broker (franz-go's kfake) for development, demos and tests: `outbox
// dev-kafka` and `outbox demo` run it, and the tests publish to it. It is a
// package of its own, as kfake is in franz-go, so that nothing the relayer
// or a consumer imports links a fake broker.
//
//	b, err := devkafka.Start(devkafka.Config{})
//	defer b.Close()
//	cfg := kafka.ClientConfig{Brokers: []string{b.Addr()}}
package devkafka

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgoutbox/outbox/kafka"
)

// Defaults of Config, applied by WithDefaults (and so by Start).
const (
	DefaultListen     = "127.0.0.1:0"
	DefaultPartitions = 6
)

// Config configures a dev broker.
type Config struct {
	// Listen is host:port. Port 0 picks a free port. Defaults to
	// DefaultListen ("127.0.0.1:0").
	Listen string
	// Partitions for auto-created topics. Defaults to DefaultPartitions
	// (6).
	Partitions int
	// DataDir, when set, persists topics and offsets across restarts
	// after a clean stop (Close): the topic list is written only then, so
	// after kill -9 or a crash the directory is not usable.
	DataDir string
	// MaxMessageBytes sets the broker's message.max.bytes: the largest
	// record batch it accepts, and the max.message.bytes of topics that do
	// not set their own. Defaults to 0: kfake's default, Kafka's 1048588.
	MaxMessageBytes int
	// Opts are extra kfake options (fault injection, broker configs).
	Opts []kfake.Opt
}

// Broker is an in-process, Kafka-wire-compatible, single-node broker
// (franz-go's kfake) with topic auto-creation. It is for development,
// demos and tests; it does not replicate and keeps data in memory unless
// given a DataDir. Any Kafka client (kcat, librdkafka, the Java client) can
// talk to it over TCP.
type Broker struct {
	*kfake.Cluster
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = DefaultPartitions
	}
	return cfg
}

// Validate reports the first field of cfg (with its defaults applied)
// that a broker cannot start with, saying what to set instead.
func (cfg Config) Validate() error {
	_, _, err := cfg.WithDefaults().listen()
	if err != nil {
		return err
	}
	if cfg.Partitions < 0 {
		return fmt.Errorf("devkafka: Config.Partitions is %d; use a positive number", cfg.Partitions)
	}
	if cfg.MaxMessageBytes < 0 {
		return fmt.Errorf("devkafka: Config.MaxMessageBytes is %d; use a positive size, or 0 for the default %d", cfg.MaxMessageBytes, kafka.DefaultMaxMessageBytes)
	}
	return nil
}

// listen splits Listen into the host and port to bind.
func (cfg Config) listen() (string, int, error) {
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return "", 0, fmt.Errorf("devkafka: listen address %q: %w; write it as host:port, e.g. 127.0.0.1:9092", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("devkafka: listen port %q is not a port number", portStr)
	}
	if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
		// The broker advertises the address it listens on; 0.0.0.0 is not
		// an address a client can connect to.
		return "", 0, fmt.Errorf("devkafka: the broker must listen on a concrete address clients can reach (e.g. 127.0.0.1:%d), not %q", port, cfg.Listen)
	}
	return host, port, nil
}

// Start applies cfg's defaults, validates it, starts the broker and
// returns once it is listening.
func Start(cfg Config) (*Broker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	host, port, err := cfg.listen()
	if err != nil {
		return nil, err
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(cfg.Partitions),
		// kfake always asks for 127.0.0.1; bind the requested host.
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	if cfg.MaxMessageBytes > 0 {
		opts = append(opts, kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(cfg.MaxMessageBytes)}))
	}
	opts = append(opts, cfg.Opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		var opErr *net.OpError
		if errors.As(err, &opErr) {
			return nil, fmt.Errorf("devkafka: cannot listen on %s: %w (is another broker running there? set Config.Listen to another port)", cfg.Listen, err)
		}
		return nil, fmt.Errorf("devkafka: start broker: %w", err)
	}
	return &Broker{Cluster: c}, nil
}

// Addr is the broker's host:port.
func (b *Broker) Addr() string { return b.ListenAddrs()[0] }
