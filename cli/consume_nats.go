package cli

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/consumer/natsconsumer"
)

// consumeNATS consumes the stream ?stream= names through a durable pull
// consumer named --group, shared by every instance of the consumer
// (--topics, when given, filter its subjects).
func consumeNATS(_ context.Context, u *url.URL, env consumeEnv) (openedConsumer, error) {
	c, err := parseNATSURL(u, os.Getenv, natsConsumeQuery...)
	if err != nil {
		return openedConsumer{}, err
	}
	stream := u.Query().Get("stream")
	if stream == "" {
		return openedConsumer{}, errors.New("--sink nats://host:port?stream=NAME: name the JetStream stream to consume (the one that captures the relay's subjects)")
	}
	opts := append(c.opts, nats.MaxReconnects(-1))
	nc, err := nats.Connect(strings.Join(c.servers, ","), opts...)
	if err != nil {
		return openedConsumer{}, fmt.Errorf("cannot reach NATS at %s: %s; check --sink", u.Redacted(), oneLine(err.Error()))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return openedConsumer{}, err
	}
	cons, err := natsconsumer.New(js, natsconsumer.Config{Stream: stream, Durable: env.group, FilterSubjects: env.topics, Dispatcher: env.disp,
		Workers: env.concurrency, Logger: env.log})
	if err != nil {
		nc.Close()
		return openedConsumer{}, err
	}
	return openedConsumer{run: cons, close: nc.Close, ping: func(ctx context.Context) error {
		if _, err := js.Stream(ctx, stream); err != nil {
			return fmt.Errorf("NATS stream %q at %s: %s; create it (nats stream add %s --subjects '...') or fix ?stream=", stream, u.Redacted(), oneLine(err.Error()), stream)
		}
		return nil
	}}, nil
}
