package relay_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
)

type bundle struct {
	db       *pgtest.DB
	broker   *kafka.DevBroker
	producer *outbox.Producer
}

func setup(t *testing.T, brokerOpts ...kfake.Opt) *bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 16})
	b, err := kafka.StartDevBroker(kafka.DevBrokerConfig{Partitions: 6, Opts: brokerOpts})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	return &bundle{db: db, broker: b, producer: p}
}

// relayer builds a relayer on the bundle's table and broker; mod adjusts
// its config.
func (b *bundle) relayer(t *testing.T, mod func(*relay.Config)) *relay.Relayer {
	t.Helper()
	client, err := kafka.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()},
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	cfg := relay.Config{
		Pool:         b.db.Pool,
		Publisher:    kafka.NewPublisher(client, kafka.PublisherConfig{}),
		Tables:       b.db.Tables,
		PollInterval: 50 * time.Millisecond,
		BackoffMin:   10 * time.Millisecond,
		BackoffMax:   200 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := relay.New(cfg)
	require.NoError(t, err)
	return r
}

// run starts r in the background; the returned stop cancels it and waits.
func run(t *testing.T, r *relay.Relayer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("relayer did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// pending counts rows not yet dispatched.
func (b *bundle) pending(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL").Scan(&n))
	return n
}

func (b *bundle) waitDrained(t *testing.T, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, timeout, 20*time.Millisecond, "outbox did not drain")
}

// emit commits one event per call, in its own transaction.
func (b *bundle) emit(t *testing.T, agg uuid.UUID, typ string, payload any) int64 {
	t.Helper()
	var id int64
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = b.producer.Emit(context.Background(), tx, outbox.Event{AggregateID: agg, Type: typ, Payload: payload})
		return err
	})
	require.NoError(t, err)
	return id
}

// record is what a test reads back from the broker.
type record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	Value     string
	Headers   map[string]string
	EventID   int64
}

// consume reads every record of topics from the beginning until want
// records arrived, or fails after timeout. Extra records arriving in a short
// grace period after that are included, so duplicates are seen.
func (b *bundle) consume(t *testing.T, want int, timeout time.Duration, topics ...string) []record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.broker.Addr()), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	var out []record
	deadline := time.Now().Add(timeout)
	grace := time.Time{}
	for {
		now := time.Now()
		if len(out) >= want && grace.IsZero() {
			grace = now.Add(300 * time.Millisecond)
		}
		if !grace.IsZero() && now.After(grace) {
			return out
		}
		if now.After(deadline) {
			require.FailNowf(t, "not enough records", "got %d of %d records within %s", len(out), want, timeout)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			rec := record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: string(r.Key), Value: string(r.Value), Headers: map[string]string{}}
			for _, h := range r.Headers {
				rec.Headers[h.Key] = string(h.Value)
			}
			rec.EventID, _ = strconv.ParseInt(rec.Headers["event_id"], 10, 64)
			out = append(out, rec)
		})
	}
}

// checkOrder asserts that, per key, event ids never go backwards within a
// partition, and that each key lives in exactly one partition. Duplicates
// (at-least-once) are allowed only as a re-send of a suffix: an id may
// reappear, but never below an id already seen after its first delivery...
// simplified here to: the sequence of first occurrences ascends.
func checkOrder(t *testing.T, recs []record) {
	t.Helper()
	partOf := map[string]int32{}
	firstSeen := map[string][]int64{}
	seen := map[int64]bool{}
	byPart := map[int32][]record{}
	for _, r := range recs {
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	for _, rs := range byPart {
		for _, r := range rs { // records of one partition arrive in offset order
			if p, ok := partOf[r.Key]; ok {
				require.Equal(t, p, r.Partition, "key %s in two partitions", r.Key)
			}
			partOf[r.Key] = r.Partition
			if !seen[r.EventID] {
				seen[r.EventID] = true
				firstSeen[r.Key] = append(firstSeen[r.Key], r.EventID)
			}
		}
	}
	for key, ids := range firstSeen {
		require.IsIncreasing(t, ids, "event ids of aggregate %s went backwards", key)
	}
}
