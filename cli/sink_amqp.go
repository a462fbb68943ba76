package cli

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/pgoutbox/outbox/relay/amqppub"
)

// amqpPasswordEnv holds the RabbitMQ password when the --sink URL names
// a user without one, which keeps it out of the process list.
const amqpPasswordEnv = "OUTBOX_AMQP_PASSWORD"

// amqpClientParams are the query parameters amqp091 itself reads from an
// AMQP URL (TLS files, heartbeat, ...); they pass through.
var amqpClientParams = []string{"auth_mechanism", "cacertfile", "certfile", "keyfile", "server_name_indication",
	"heartbeat", "connection_timeout", "channel_max"}

// openAMQPURL opens the RabbitMQ sink for
// amqp[s]://user[:pass]@host:port/vhost?exchange=outbox&max_bytes=N.
func openAMQPURL(_ context.Context, u *url.URL, env sinkEnv) (openedSink, error) {
	cfg, err := amqpConfig(u, os.Getenv(amqpPasswordEnv))
	if err != nil {
		return openedSink{}, err
	}
	cfg.Source, cfg.ConfirmTimeout, cfg.Logger, cfg.CloudEvents = env.source, env.deliver, env.log, env.ce
	if err := cfg.Validate(); err != nil {
		return openedSink{}, fmt.Errorf("--sink: %w", err)
	}
	pub, err := amqppub.New(cfg)
	if err != nil {
		return openedSink{}, fmt.Errorf("--sink: %w", err)
	}
	return openedSink{
		sink: pub,
		ping: func(ctx context.Context) error {
			if err := pub.Ping(ctx); err != nil {
				return fmt.Errorf("cannot reach RabbitMQ at %s: %w; check --sink and that the server runs", u.Redacted(), err)
			}
			return nil
		},
		close: func() { _ = pub.Close() },
	}, nil
}

// amqpConfig reads the sink's settings from its URL: the exchange and
// max_bytes parameters are the sink's, the client's own pass through,
// any other is refused as a likely typo. password fills in a user's
// missing password.
func amqpConfig(u *url.URL, password string) (amqppub.Config, error) {
	if u.Host == "" {
		return amqppub.Config{}, fmt.Errorf("--sink %s names no host; write amqp://user@host:5672/vhost", u.Redacted())
	}
	var cfg amqppub.Config
	q := u.Query()
	for name, vals := range q {
		switch {
		case name == "exchange":
			cfg.Exchange = vals[0]
			if cfg.Exchange == "" {
				return cfg, fmt.Errorf("--sink: ?exchange= is empty; name a topic exchange, or drop it for %q", amqppub.DefaultExchange)
			}
		case name == "max_bytes":
			n, err := strconv.Atoi(vals[0])
			if err != nil || n <= 0 {
				return cfg, fmt.Errorf("--sink: ?max_bytes=%s is not a positive number of bytes; set it to the server's max_message_size", vals[0])
			}
			cfg.MaxBytes = n
		case !slices.Contains(amqpClientParams, name):
			return cfg, fmt.Errorf("--sink: unknown parameter %q for RabbitMQ; use exchange, max_bytes or the client's own (%s)", name, strings.Join(amqpClientParams, ", "))
		}
	}
	q.Del("exchange")
	q.Del("max_bytes")
	c := *u
	c.RawQuery = q.Encode()
	if c.User != nil {
		if _, set := c.User.Password(); !set && password != "" {
			c.User = url.UserPassword(c.User.Username(), password)
		}
	}
	cfg.URL = c.String()
	return cfg, nil
}
