package kafkapub_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// A broker replaced under a running publisher (stopped, and a new one with
// no data started on the same address: every topic gets a new id, as when
// a topic is deleted and recreated) is followed by the publisher itself:
// publishing fails while no broker answers, and Ready says so; once the new
// broker is up, the next publishes go through, in order per aggregate, and
// Ready is nil again.
func TestPublishFollowsAReplacedBroker(t *testing.T) {
	t.Parallel()
	addr := kafkatest.FreeAddr(t)
	start := func() *devkafka.Broker {
		b, err := devkafka.Start(devkafka.Config{Listen: addr, Partitions: 3})
		require.NoError(t, err)
		t.Cleanup(b.Close)
		return b
	}
	b := start()
	cl, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{addr},
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(2 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	pub := kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{})
	ctx := context.Background()

	aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	var id int64
	batch := func() []relay.Message {
		var msgs []relay.Message
		for range 4 {
			for _, a := range aggs {
				id++
				msgs = append(msgs, msg(id, a, "order", 50))
			}
		}
		return msgs
	}
	for _, err := range pub.Publish(ctx, batch()) {
		require.NoError(t, err)
	}
	require.NoError(t, pub.Ready(ctx))

	b.Close()
	for _, err := range pub.Publish(ctx, batch()) {
		require.Error(t, err, "no broker, no acknowledgement")
		require.False(t, relay.IsPermanent(err), "an outage is not the records' fault: %v", err)
	}
	require.Error(t, pub.Ready(ctx), "not ready while publishing fails")

	b = start()
	var sent []relay.Message
	healed := false
	deadline := time.Now().Add(30 * time.Second)
	for !healed && time.Now().Before(deadline) {
		msgs := batch()
		errs := pub.Publish(ctx, msgs)
		healed = true
		for i, err := range errs {
			if err != nil {
				healed = false
				t.Logf("event %d: %v", msgs[i].ID, err)
			}
		}
		if healed {
			sent = msgs
		} else {
			time.Sleep(200 * time.Millisecond)
		}
	}
	require.True(t, healed, "the publisher did not follow the new broker within 30s")
	for _, err := range pub.Publish(ctx, batch()) {
		require.NoError(t, err)
	}
	require.NoError(t, pub.Ready(ctx), "ready again once publishing works")

	// The new broker has the batch whole, each aggregate's records in
	// order (they are in one partition).
	got := kafkatest.Read(t, b.Addr(), 10*time.Second, kafkatest.AtLeast(2*len(sent)), "order")
	byAgg := map[string][]int64{}
	for _, r := range got {
		byAgg[string(r.Key)] = append(byAgg[string(r.Key)], kafkatest.EventID(r))
	}
	for _, a := range aggs {
		ids := byAgg[a.String()]
		require.IsIncreasing(t, ids, "aggregate %s in order", a)
		require.Len(t, ids, 8, "aggregate %s: both batches after the broker came back", a)
	}
}

// A topic deleted and recreated on a running broker (a new topic id) is
// followed too: the publishes after the recreation go through, to the new
// topic.
func TestPublishFollowsARecreatedTopic(t *testing.T) {
	t.Parallel()
	pub, b := publisher(t, 0, 0, false)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	agg := uuid.New()
	for _, err := range pub.Publish(ctx, []relay.Message{msg(1, agg, "order", 50), msg(2, agg, "order", 50)}) {
		require.NoError(t, err)
	}

	_, err = adm.DeleteTopics(ctx, "order")
	require.NoError(t, err)
	_, err = adm.CreateTopic(ctx, 1, 1, nil, "order")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, err := range pub.Publish(ctx, []relay.Message{msg(3, agg, "order", 50), msg(4, agg, "order", 50)}) {
			if err != nil {
				t.Logf("publish: %v", err)
				return false
			}
		}
		return true
	}, 30*time.Second, 200*time.Millisecond, "the publisher did not follow the recreated topic within 30s")
	require.NoError(t, pub.Ready(ctx))
	got := kafkatest.Read(t, b.Addr(), 10*time.Second, kafkatest.AtLeast(2), "order")
	require.Equal(t, []int64{3, 4}, []int64{kafkatest.EventID(got[0]), kafkatest.EventID(got[1])}, "the new topic has the records sent after its creation")
}
