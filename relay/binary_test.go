package relay_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/binarytest"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/redispub"
	"github.com/pgoutbox/outbox/routing"
)

func binaryProducer(t *testing.T, db *pgtest.DB) *outbox.Producer {
	t.Helper()
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables, BinaryPayloads: true})
	require.NoError(t, err)
	return p
}

// The polling relay publishes binary payloads to Kafka byte for byte, with
// their content type in the content-type header; JSON events beside them
// as before.
func TestPollingRelaysBinaryPayloadsExactlyToKafka(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m, err := migrate.New(b.db.Tables)
	require.NoError(t, err)
	_, err = m.EnableBinaryPayloads(context.Background(), b.db.Pool)
	require.NoError(t, err)
	want := binarytest.Emit(t, b.db, b.db.Pool, binaryProducer(t, b.db), uuid.New(), "bin.happened")

	run(t, b.relayer(t, nil))
	recs := kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeast(len(want)), "bin")
	got := map[int64]binarytest.Want{}
	for _, r := range recs {
		got[kafkatest.EventID(r)] = binarytest.Want{Payload: r.Value, ContentType: kafkatest.Headers(r)[outbox.HeaderContentType]}
	}
	binarytest.Check(t, want, got)
	require.Zero(t, b.pending(t))
}

// The same rows through the Redis Streams sink: the payload field holds
// the exact bytes, the content-type field the row's content type.
func TestPollingRelaysBinaryPayloadsExactlyToRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{BinaryPayloads: true})
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { _ = client.Close() })
	pub, err := redispub.New(client, redispub.Config{})
	require.NoError(t, err)
	stream := "bin" + uuid.NewString()[:8]
	t.Cleanup(func() { client.Del(context.Background(), stream) })
	want := binarytest.Emit(t, db, db.Pool, binaryProducer(t, db), uuid.New(), stream+".happened")

	r, err := relay.New(relay.Config{Common: relay.Common{Pool: db.Pool, Sink: pub, Tables: db.Tables}, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	run(t, r)
	var entries []redis.XMessage
	require.Eventually(t, func() bool {
		entries, err = client.XRange(ctx, stream, "-", "+").Result()
		return err == nil && len(entries) >= len(want)
	}, 30*time.Second, 50*time.Millisecond, "the relay never added every event to %s", stream)
	got := map[int64]binarytest.Want{}
	for _, e := range entries {
		id, err := strconv.ParseInt(e.Values[outbox.HeaderEventID].(string), 10, 64)
		require.NoError(t, err)
		got[id] = binarytest.Want{Payload: []byte(e.Values[routing.RedisPayloadField].(string)), ContentType: e.Values[outbox.HeaderContentType].(string)}
	}
	binarytest.Check(t, want, got)
}

// A relayer that started before the table had binary payloads claims with
// the JSON-only claim: it holds a binary row (undecodable) rather than
// publish it empty, and a relayer started afterwards publishes it whole.
func TestRelayerStartedBeforeBinaryPayloadsHoldsBinaryRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	stop := run(t, b.relayer(t, func(c *relay.Config) { c.HoldOut = 200 * time.Millisecond }))
	json := b.emit(t, uuid.New(), "early.happened", map[string]int{"n": 1})
	kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeast(1), "early")

	m, err := migrate.New(b.db.Tables)
	require.NoError(t, err)
	_, err = m.EnableBinaryPayloads(ctx, b.db.Pool)
	require.NoError(t, err)
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	id, err := binaryProducer(t, b.db).Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "early.happened",
		Payload: outbox.Bytes{ContentType: "application/x-protobuf", Data: []byte{1, 2, 0}}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Eventually(t, func() bool {
		for _, h := range b.holds(t) {
			if h.EventID == id {
				require.Equal(t, relay.ReasonUndecodable, h.Reason)
				require.Contains(t, h.Err, "restart")
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "the binary row was never held")
	stop()
	recs := kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeastThenQuiet(1, time.Second), "early")
	require.Len(t, recs, 1, "only the JSON event was published")
	require.Equal(t, json, kafkatest.EventID(recs[0]))

	run(t, b.relayer(t, nil))
	recs = kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeast(2), "early")
	require.Equal(t, id, kafkatest.EventID(recs[1]))
	require.Equal(t, []byte{1, 2, 0}, recs[1].Value)
	require.Equal(t, "application/x-protobuf", kafkatest.Headers(recs[1])[outbox.HeaderContentType])
}
