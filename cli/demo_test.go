package cli_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// `outbox demo --brokers` on a broker of its own (the dev broker here)
// logs the database it used and deletes the topics it made.
func TestDemoCommandLogsItsDatabaseAndDeletesItsTopics(t *testing.T) {
	t.Parallel()
	require.NoError(t, pgtest.EnsureDatabase(context.Background()))
	b, err := devkafka.Start(devkafka.Config{})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	code, out, stderr := outbox(t, "demo", "--database-url", pgtest.URL(), "--brokers", b.Addr(), "--orders", "20", "--writers", "2", "--redeliver", "2")
	require.Equal(t, 0, code, stderr+out)
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	require.Contains(t, stderr, `msg="connected to Postgres" host=`+u.Hostname())
	require.Contains(t, stderr, "database="+strings.TrimPrefix(u.Path, "/"))
	require.Equal(t, 1, strings.Count(stderr, "connected to Postgres"), stderr)
	require.Contains(t, out, "deleted the demo's topics outbox_demo_")
	require.Contains(t, out, "all invariants hold")

	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	require.NoError(t, err)
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(context.Background())
	require.NoError(t, err)
	require.Empty(t, topics.Names())
}

// `outbox demo --sink` runs the same scenario and checks the same
// invariants on another broker: Redis Streams, RabbitMQ and NATS
// JetStream on the machine's servers (the demo's streams and queues
// deleted at the end; JetStream drops the forced redeliveries by their
// Nats-Msg-Id), and a webhook endpoint the demo serves itself.
func TestDemoCommandOnOtherSinks(t *testing.T) {
	t.Parallel()
	require.NoError(t, pgtest.EnsureDatabase(context.Background()))
	for _, sink := range []string{"redis://127.0.0.1:6379/0", "amqp://guest:guest@127.0.0.1:5672/", "nats://127.0.0.1:4222", "webhook"} {
		t.Run(sink, func(t *testing.T) {
			t.Parallel()
			code, out, stderr := outbox(t, "demo", "--database-url", pgtest.URL(), "--sink", sink, "--orders", "60", "--writers", "2", "--redeliver", "5")
			require.Equal(t, 0, code, stderr+out)
			require.Contains(t, out, "all invariants hold")
			require.Regexp(t, `events consumed +54 +ok`, out)
			require.Regexp(t, `duplicates skipped +(5 +ok|0 +ok \(the broker dropped the redelivered copies)`, out)
			require.NotContains(t, out, "warning:")
		})
	}
	code, _, stderr := outbox(t, "demo", "--database-url", pgtest.URL(), "--sink", "kafka://127.0.0.1:1", "--brokers", "127.0.0.1:2")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--sink and --brokers both name the broker")
}
