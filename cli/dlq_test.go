package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
)

// A handler that refuses an event sends it to the dead-letter topic;
// `outbox dlq list` shows it with its error, `outbox dlq replay` (a dry
// run without --yes) sends it back, and the consumer, fixed, processes it
// once; the events it processed before are not applied again.
func TestDLQListAndReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6})
	_, err := db.Pool.Exec(ctx, `CREATE TABLE applied (event_id BIGINT PRIMARY KEY, n INT NOT NULL DEFAULT 1)`)
	require.NoError(t, err)
	b, err := devkafka.Start(devkafka.Config{Partitions: 2})
	require.NoError(t, err)
	t.Cleanup(b.Close)

	cl, err := kgo.NewClient(append(kafka.ProducerOptions(), kgo.SeedBrokers(b.Addr()))...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	for id := 1; id <= 3; id++ {
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: "order", Key: []byte("7d0c6f5e-9a5b-4d64-8f59-0d0b4ad2c1b3"), Value: []byte(`{"n": ` + strconv.Itoa(id) + `}`),
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte(strconv.Itoa(id))}, {Key: outbox.HeaderEventType, Value: []byte("order.placed")}, {Key: "x-note", Value: []byte("kept")}}}).FirstErr())
	}

	var mu sync.Mutex
	refuse := true
	apply := func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		mu.Lock()
		no := refuse && ev.ID == 2
		mu.Unlock()
		if no {
			return consumer.Permanent(errors.New("no price for sku 42"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied (event_id) VALUES ($1) ON CONFLICT (event_id) DO UPDATE SET n = applied.n + 1`, ev.ID)
		return err
	}
	// runFor runs a consumer (one Run per Consumer) until done.
	runFor := func(done func(*consumer.Consumer) bool) {
		t.Helper()
		c, err := consumer.New(consumer.Config{Name: "billing", Pool: db.Pool, Tables: db.Tables, Client: kafka.ClientConfig{Brokers: []string{b.Addr()}},
			Topics: []string{"order"}, Handlers: map[string]consumer.Handler{"order.placed": apply}})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		go func() { stopped <- c.Run(rctx) }()
		require.Eventually(t, func() bool { return done(c) }, 30*time.Second, 50*time.Millisecond)
		cancel()
		require.NoError(t, <-stopped)
	}
	applied := func() int { return int(countRows(t, db, "SELECT count(*) FROM applied")) }
	runFor(func(c *consumer.Consumer) bool { return c.Stats().DeadLettered == 1 && applied() == 2 })

	brokers := []string{"--brokers", b.Addr()}
	code, out, stderr := runDLQCLI(t, append([]string{"dlq", "list", "--topic", "order.dlq"}, brokers...)...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `\d+/0\s+2\s+order.placed\s+billing\s+1\s+order\s+permanent: no price for sku 42`, out)
	require.Contains(t, out, "1 dead letters; 'outbox dlq replay --topic order.dlq' sends them back")

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "list", "--topic", "order.dlq", "--json"}, brokers...)...)
	require.Equal(t, 0, code, stderr)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed, 1)
	require.Equal(t, float64(2), listed[0]["event_id"])
	require.Equal(t, "order", listed[0]["original_topic"])
	require.Equal(t, map[string]any{"n": float64(2)}, listed[0]["payload"])
	require.Equal(t, "kept", listed[0]["headers"].(map[string]any)["x-note"])

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "replay", "--topic", "order.dlq", "--consumer", "someone-else"}, brokers...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "no dead letters in order.dlq (of consumer someone-else): nothing to replay")

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "replay", "--topic", "order.dlq", "--event-id", "2"}, brokers...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "would send 1 dead letters back: 1 to order")
	require.Contains(t, out, "dry run: nothing changed; add --yes")
	require.Len(t, kafkatest.Read(t, b.Addr(), 10*time.Second, kafkatest.AtLeastThenQuiet(3, 500*time.Millisecond), "order"), 3, "a dry run sends nothing")

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "replay", "--topic", "order.dlq", "--event-id", "2", "--yes"}, brokers...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "sent 1 of 1 dead letters back")

	mu.Lock()
	refuse = false
	mu.Unlock()
	runFor(func(*consumer.Consumer) bool { return applied() == 3 })
	require.Equal(t, 3, int(countRows(t, db, "SELECT sum(n) FROM applied")), "each event applied once")
	replayed := kafkatest.Read(t, b.Addr(), 10*time.Second, kafkatest.AtLeast(4), "order")
	last := kafkatest.Headers(replayed[len(replayed)-1])
	require.Equal(t, map[string]string{outbox.HeaderEventID: "2", outbox.HeaderEventType: "order.placed", "x-note": "kept"}, last,
		"the replayed record carries the original headers, none of the dead letter's")
}

// dlq refuses what it cannot use, saying what to give instead.
func TestDLQRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "list", "--brokers", "127.0.0.1:1"}, "--topic is required"},
		{[]string{"dlq", "replay", "--topic", "order.dlq", "--event-id", "x", "--brokers", "127.0.0.1:1"}, "--event-id: event id \"x\""},
		{[]string{"dlq", "list", "--topic", "order.dlq", "--brokers", "127.0.0.1:1", "--timeout", "0s"}, "--timeout 0s: use a positive duration"},
		{[]string{"dlq", "list", "--topic", "order.dlq", "--brokers", "", "--timeout", "1s"}, "no Kafka brokers"},
		{[]string{"dlq", "lsit"}, "unknown command \"lsit\""},
	} {
		code, _, stderr := runDLQCLI(t, c.args...)
		require.NotEqual(t, 0, code, c.args)
		require.Contains(t, stderr, c.want, c.args)
	}
}

// runDLQCLI runs the CLI with args, which name no database: dlq has none.
func runDLQCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func countRows(t *testing.T, db *pgtest.DB, sql string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}
