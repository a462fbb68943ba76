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

// natsDemoStream creates the demo's stream, capturing its topic's
// subjects (prefix + "order.>"), and returns its name.
func natsDemoStream(ctx context.Context, u *url.URL, prefix string) (string, error) {
	js, closeConn, err := natsJetStream(u)
	if err != nil {
		return "", err
	}
	defer closeConn()
	name := strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(strings.TrimSuffix(prefix, ".")))
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + "order.>"}}); err != nil {
		return "", fmt.Errorf("create NATS stream %s: %s", name, oneLine(err.Error()))
	}
	return name, nil
}

// natsDeleteStream deletes the demo's stream.
func natsDeleteStream(ctx context.Context, u *url.URL, name string) error {
	js, closeConn, err := natsJetStream(u)
	if err != nil {
		return err
	}
	defer closeConn()
	return js.DeleteStream(ctx, name)
}

// natsJetStream connects to the server a nats:// URL names.
func natsJetStream(u *url.URL) (jetstream.JetStream, func(), error) {
	c, err := parseNATSURL(u, os.Getenv, natsConsumeQuery...)
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(strings.Join(c.servers, ","), c.opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot reach NATS at %s: %s", u.Redacted(), oneLine(err.Error()))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}
