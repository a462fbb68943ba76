package consumer_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
)

type bundle struct {
	db     *pgtest.DB
	broker *devkafka.Broker
}

// setup gives a test its own schema, with an effects table handlers write
// to, and its own broker.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	_, err := db.Pool.Exec(context.Background(),
		`CREATE TABLE effects (source TEXT NOT NULL, event_id BIGINT NOT NULL, type TEXT NOT NULL, n INT NOT NULL DEFAULT 1, PRIMARY KEY (source, event_id))`)
	require.NoError(t, err)
	b, err := devkafka.Start(devkafka.Config{Partitions: 3, Opts: []kfake.Opt{kfake.GroupMinSessionTimeout(100 * time.Millisecond)}})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return &bundle{db: db, broker: b}
}

// record is the effect handlers leave: one row per applied event; a second
// application bumps n.
func record(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (source, event_id, type) VALUES ($1, $2, $3)
ON CONFLICT (source, event_id) DO UPDATE SET n = effects.n + 1`, ev.Source, ev.ID, ev.Type)
	return err
}

// effects returns n per "source/event_id".
func (b *bundle) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT source, event_id, n FROM effects`)
	require.NoError(t, err)
	out := map[string]int{}
	var (
		src string
		id  int64
		n   int
	)
	_, err = pgx.ForEachRow(rows, []any{&src, &id, &n}, func() error {
		out[src+"/"+strconv.FormatInt(id, 10)] = n
		return nil
	})
	require.NoError(t, err)
	return out
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// kafkaOpts make group membership quick to settle in tests.
func kafkaOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(1500 * time.Millisecond),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.RebalanceTimeout(5 * time.Second),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.RecordDeliveryTimeout(5 * time.Second),
	}
}

// config is a consumer config on the bundle, reading topic "t", with
// quick retries; tests adjust it.
func (b *bundle) config(handlers map[string]consumer.Handler) consumer.Config {
	return consumer.Config{
		Name:       "test",
		Pool:       b.db.Pool,
		Tables:     b.db.Tables,
		Client:     kafka.ClientConfig{Brokers: []string{b.broker.Addr()}, Opts: kafkaOpts()},
		Topics:     []string{"t"},
		Handlers:   handlers,
		BackoffMin: time.Millisecond,
		BackoffMax: 10 * time.Millisecond,
	}
}

// run starts c; stop cancels it and returns Run's error, failing the test
// if Run does not return within 20s.
func run(t *testing.T, c *consumer.Consumer) (stop func() error) {
	t.Helper()
	return runCtx(t, context.Background(), c)
}

// runCtx is run with Run's context derived from parent.
func runCtx(t *testing.T, parent context.Context, c *consumer.Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				t.Error("consumer did not stop within 20s")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// producer returns a client that writes records to the partition they
// name.
func (b *bundle) producer(t *testing.T) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.broker.Addr()), kgo.AllowAutoTopicCreation(),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func produce(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
}

// event builds a record as the relayer would: event_id, event_type and
// content-type headers, then extra header pairs.
func event(topic string, partition int32, id int64, typ, payload string, extra ...string) *kgo.Record {
	r := &kgo.Record{Topic: topic, Partition: partition, Key: []byte("0b6f9f0e-5a64-4e39-9d0e-6b8a6f7b1c2d"), Value: []byte(payload)}
	r.Headers = append(r.Headers,
		kgo.RecordHeader{Key: outbox.HeaderEventID, Value: []byte(strconv.FormatInt(id, 10))},
		kgo.RecordHeader{Key: outbox.HeaderEventType, Value: []byte(typ)},
		kgo.RecordHeader{Key: outbox.HeaderContentType, Value: []byte("application/json")},
	)
	for i := 0; i+1 < len(extra); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: extra[i], Value: []byte(extra[i+1])})
	}
	return r
}

// read returns want records of topic, from the start, failing after
// timeout.
func (b *bundle) read(t *testing.T, topic string, want int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	return kafkatest.Read(t, b.broker.Addr(), timeout, kafkatest.AtLeast(want), topic)
}

func headers(r *kgo.Record) map[string]string { return kafkatest.Headers(r) }
