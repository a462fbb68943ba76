package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/internal/demo"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/redispub"
)

// demoWebhook is `outbox demo --sink webhook`: the demo serves the
// receiving endpoint itself, on a free loopback port, with a fresh secret.
const demoWebhook = "webhook"

// demoSink builds the demo's broker from --sink with the same openers as
// `outbox relay --sink` and `outbox consume --sink`; nil for Kafka, whose
// kafka:// brokers it puts in k. cleanup removes what it made locally (the
// webhook secret's file).
func demoSink(raw string, k *kafkaFlags, log *slog.Logger) (s *demo.Sink, cleanup func(), err error) {
	cleanup = func() {}
	if raw == "" {
		return nil, cleanup, nil
	}
	if raw == demoWebhook {
		if raw, cleanup, err = demoWebhookURL(); err != nil {
			return nil, cleanup, err
		}
	}
	u, openSink, err := parseSinkURL(raw)
	if err != nil {
		return nil, cleanup, err
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme == "kafka" {
		k.brokers = u.Host
		return nil, cleanup, nil
	}
	openConsumer, ok := consumeSchemes[scheme]
	if !ok {
		return nil, cleanup, fmt.Errorf("--sink %s: the demo needs a consumer for it, and `outbox consume` has none for %s; use %s, or --sink webhook", u.Redacted(), scheme, consumeSchemeList())
	}
	t := &demoTransport{u: u, scheme: scheme, log: log, openSink: openSink, openConsumer: openConsumer}
	s = &demo.Sink{Name: strings.SplitN(u.Redacted(), "?", 2)[0], Open: t.open, Consume: t.consume,
		Dedupes: scheme == "nats"} // Nats-Msg-Id, within the stream's duplicate window
	if scheme != "http" {
		s.Remove = t.remove
	}
	return s, cleanup, nil
}

// demoTransport opens the demo's relayers and consumer on one --sink,
// with what the server needs first: a stream on NATS, a bound queue on
// RabbitMQ (both the demo's own, removed at the end).
type demoTransport struct {
	u            *url.URL
	scheme       string
	log          *slog.Logger
	openSink     sinkOpener
	openConsumer consumeOpener
	natsStream   string // the demo's stream, once consume made it
}

func (t *demoTransport) isAMQP() bool { return t.scheme == "amqp" || t.scheme == "amqps" }

func (t *demoTransport) open(ctx context.Context, source string) (relay.Sink, func(), error) {
	o, err := t.openSink(ctx, t.u, sinkEnv{log: t.log, source: source, deliver: 10 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	if err := pingWithin(ctx, o.ping, 10*time.Second); err != nil {
		o.close()
		return nil, nil, err
	}
	return o.sink, o.close, nil
}

func (t *demoTransport) consume(ctx context.Context, disp consumer.DispatcherConfig, prefix, topic string) (demo.Consumer, func(), error) {
	env := consumeEnv{log: t.log, disp: disp, group: disp.Name}
	cu := t.u
	var err error
	switch {
	case t.scheme == "nats":
		// A stream of the demo's own, for its topic's subjects.
		if t.natsStream, err = natsDemoStream(ctx, t.u, prefix); err != nil {
			return nil, nil, err
		}
		c := *t.u
		q := c.Query()
		q.Set("stream", t.natsStream)
		c.RawQuery = q.Encode()
		cu = &c
	case t.isAMQP():
		// A queue of the demo's own, bound for its topic's types.
		if err := amqpDemoQueue(t.u, prefix, prefix+"loyalty"); err != nil {
			return nil, nil, err
		}
		env.topics = []string{prefix + "loyalty"}
	case t.scheme != "http": // a webhook endpoint is sent to
		env.topics = []string{topic}
	}
	c, err := t.openConsumer(ctx, cu, env)
	if err != nil {
		return nil, nil, err
	}
	if err := c.ping(ctx); err != nil {
		c.close()
		return nil, nil, err
	}
	return c.run, c.close, nil
}

// remove deletes the streams or queues the run made or filled.
func (t *demoTransport) remove(ctx context.Context, prefix, topic string) error {
	switch {
	case t.scheme == "redis" || t.scheme == "rediss":
		return removeRedisStreams(ctx, t.u, topic)
	case t.isAMQP():
		return amqpDeleteQueues(t.u, prefix+"loyalty")
	case t.scheme == "nats" && t.natsStream != "":
		return natsDeleteStream(ctx, t.u, t.natsStream)
	}
	return nil
}

// pingWithin retries ping until it succeeds or d has passed: the demo's
// own webhook endpoint may still be starting.
func pingWithin(ctx context.Context, ping func(context.Context) error, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		err := ping(ctx)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// demoWebhookURL is a loopback endpoint on a free port, with a fresh
// secret in a file of its own.
func demoWebhookURL() (string, func(), error) {
	dir, err := os.MkdirTemp("", "outbox-demo-webhook-")
	if err != nil {
		return "", func() {}, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	var key [32]byte
	_, _ = rand.Read(key[:])
	file := filepath.Join(dir, "secret")
	if err := os.WriteFile(file, []byte("whsec_"+base64.StdEncoding.EncodeToString(key[:])), 0o600); err != nil {
		return "", cleanup, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", cleanup, err
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", cleanup, err
	}
	return "http://" + addr + "/outbox-demo?secret_file=" + url.QueryEscape(file), cleanup, nil
}

// removeRedisStreams deletes the demo's stream and its dead-letter stream
// (their consumer groups go with them).
func removeRedisStreams(ctx context.Context, u *url.URL, topic string) error {
	opts, _, err := redispub.ParseURL(u.String(), redispub.Config{})
	if err != nil {
		return err
	}
	if pw := os.Getenv(redisPasswordEnv); pw != "" {
		opts.Password = pw
	}
	client := redis.NewClient(opts)
	defer client.Close()
	if err := client.Del(ctx, topic, topic+":dlq").Err(); err != nil {
		return errors.New("delete streams " + topic + ": " + err.Error())
	}
	return nil
}
