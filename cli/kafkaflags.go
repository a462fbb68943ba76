package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// kafkaFlags are the connection flags of every command that talks to Kafka.
type kafkaFlags struct {
	brokers      string
	tls          bool
	tlsCA        string
	tlsCert      string
	tlsKey       string
	tlsInsecure  bool
	saslMech     string
	saslUser     string
	saslPassword string
}

func (k *kafkaFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&k.brokers, "brokers", os.Getenv("KAFKA_BROKERS"), "Kafka brokers, comma-separated host:port; env KAFKA_BROKERS")
	fs.BoolVar(&k.tls, "tls", false, "connect to Kafka over TLS")
	fs.StringVar(&k.tlsCA, "tls-ca", "", "PEM file of CA certificates to trust (implies --tls)")
	fs.StringVar(&k.tlsCert, "tls-cert", "", "PEM client certificate for mutual TLS (implies --tls)")
	fs.StringVar(&k.tlsKey, "tls-key", "", "PEM client key for mutual TLS")
	fs.BoolVar(&k.tlsInsecure, "tls-insecure", false, "with --tls: skip TLS server certificate verification (testing only)")
	fs.StringVar(&k.saslMech, "sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	fs.StringVar(&k.saslUser, "sasl-user", os.Getenv("KAFKA_SASL_USER"), "SASL user; env KAFKA_SASL_USER")
	fs.StringVar(&k.saslPassword, "sasl-password", "", "SASL password; prefer env KAFKA_SASL_PASSWORD, which keeps it out of the process list")
}

func (k *kafkaFlags) config() kafka.ClientConfig {
	pw := k.saslPassword
	if pw == "" {
		pw = os.Getenv("KAFKA_SASL_PASSWORD")
	}
	var brokers []string
	for _, b := range strings.Split(k.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	return kafka.ClientConfig{
		Brokers: brokers, TLS: k.tls, CAFile: k.tlsCA, CertFile: k.tlsCert, KeyFile: k.tlsKey,
		TLSInsecureSkipVerify: k.tlsInsecure, SASLMechanism: k.saslMech, SASLUser: k.saslUser, SASLPassword: pw,
	}
}

// brokersConfig is config for a command that cannot run without a broker;
// log gets a warning when it sends a password in clear text.
func (k *kafkaFlags) brokersConfig(log *slog.Logger) (kafka.ClientConfig, error) {
	cfg := k.config()
	if len(cfg.Brokers) == 0 {
		return cfg, errors.New("no Kafka brokers: pass --brokers host:port or set KAFKA_BROKERS (for a local broker run 'outbox dev-kafka')")
	}
	return cfg, k.check(cfg, log)
}

// check refuses the flag combinations kafka.ClientConfig.Options refuses,
// in terms of the flags: the library's errors name its config fields.
func (k *kafkaFlags) check(cfg kafka.ClientConfig, log *slog.Logger) error {
	tlsOn := k.tls || k.tlsCA != "" || k.tlsCert != ""
	if k.tlsInsecure && !tlsOn {
		return errors.New("--tls-insecure without --tls would connect in plaintext: add --tls (--tls-insecure only skips the certificate check of a TLS connection), or drop --tls-insecure")
	}
	if tlsOn && (k.tlsCert == "") != (k.tlsKey == "") {
		return errors.New("a TLS client certificate needs both --tls-cert and --tls-key")
	}
	if k.saslMech != "" && k.saslUser == "" {
		return fmt.Errorf("SASL %s needs a user (--sasl-user or KAFKA_SASL_USER) and password (--sasl-password or KAFKA_SASL_PASSWORD)", k.saslMech)
	}
	if cfg.PlaintextPassword() && log != nil {
		log.Warn("SASL PLAIN without TLS sends the Kafka password in clear text to the brokers; add --tls, or use SCRAM-SHA-512",
			"brokers", strings.Join(cfg.Brokers, ","), "sasl_user", cfg.SASLUser)
	}
	return nil
}

// optionalBrokersConfig is config for a command that starts a dev broker of
// its own unless --brokers names a cluster.
func (k *kafkaFlags) optionalBrokersConfig(log *slog.Logger) (kafka.ClientConfig, error) {
	cfg := k.config()
	if len(cfg.Brokers) == 0 {
		return cfg, nil
	}
	return cfg, k.check(cfg, log)
}

// kafkaClient is the relay's Kafka client: records wait at most deliver
// for the broker; shared builds it for several outboxes' publishers
// (kafkapub.NewSharedPublisherClient). The caller closes it.
func kafkaClient(cfg kafka.ClientConfig, deliver time.Duration, log *slog.Logger, shared bool) (*kgo.Client, error) {
	cfg.Opts = append(cfg.Opts, kgo.RecordDeliveryTimeout(deliver))
	cfg.Logger = log
	if shared {
		return kafkapub.NewSharedPublisherClient(cfg)
	}
	return kafkapub.NewPublisherClient(cfg)
}

// ping checks that a broker answers, with an error that says what to do.
func pingKafka(ctx context.Context, cl *kgo.Client, brokers []string) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.Ping(pctx); err != nil {
		return fmt.Errorf("cannot reach Kafka at %s: %s; check --brokers or KAFKA_BROKERS (for a local broker run 'outbox dev-kafka')", strings.Join(brokers, ","), oneLine(err.Error()))
	}
	return nil
}
