package consumer_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/devkafka"
)

// A broker replaced under a running consumer (stopped, and a new one with
// no data started on the same address: the topic has a new id, as when it
// is deleted and recreated) is followed by the consumer itself: the events
// written to the new broker are processed, each once, within 30s, and none
// is skipped for an offset of the old topic.
func TestConsumerFollowsAReplacedBroker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	start := func() {
		kb, err := devkafka.Start(devkafka.Config{Listen: addr, Partitions: 3, Opts: []kfake.Opt{kfake.GroupMinSessionTimeout(100 * time.Millisecond)}})
		require.NoError(t, err)
		t.Cleanup(kb.Close)
		b.broker = kb
	}
	start()
	c, err := consumer.New(b.config(map[string]consumer.Handler{"t.x": record}))
	require.NoError(t, err)
	stop := run(t, c)

	// Produce through a client of each broker, so that only the consumer
	// has to follow the new one.
	produceTo := func(from, to int64) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.AllowAutoTopicCreation(),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
		require.NoError(t, err)
		defer cl.Close()
		var recs []*kgo.Record
		for id := from; id <= to; id++ {
			recs = append(recs, event("t", int32(id%3), id, "t.x", `{}`))
		}
		produce(t, cl, recs...)
	}
	processed := func(n int) func() bool {
		return func() bool { return len(b.effects(t)) >= n }
	}
	produceTo(1, 30)
	require.Eventually(t, processed(30), 20*time.Second, 50*time.Millisecond)

	b.broker.Close()
	time.Sleep(500 * time.Millisecond)
	start()
	// Fewer records than before on each partition: an offset of the old
	// topic committed to the new one would skip them all.
	produceTo(31, 45)
	require.Eventually(t, processed(45), 30*time.Second, 100*time.Millisecond,
		"the consumer did not follow the new broker within 30s")
	require.NoError(t, stop())
	for id, n := range b.effects(t) {
		require.Equal(t, 1, n, "event %s applied once", id)
	}
	require.Len(t, b.effects(t), 45)
}

// A topic deleted and recreated on a running broker is followed too: the
// events written to the new topic are processed, each once.
func TestConsumerFollowsARecreatedTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := consumer.New(b.config(map[string]consumer.Handler{"t.x": record}))
	require.NoError(t, err)
	stop := run(t, c)
	p := b.producer(t)
	for id := int64(1); id <= 9; id++ {
		produce(t, p, event("t", int32(id%3), id, "t.x", `{}`))
	}
	require.Eventually(t, func() bool { return len(b.effects(t)) == 9 }, 20*time.Second, 50*time.Millisecond)

	adm := kadm.NewClient(p)
	ctx := context.Background()
	_, err = adm.DeleteTopics(ctx, "t")
	require.NoError(t, err)
	_, err = adm.CreateTopic(ctx, 3, 1, nil, "t")
	require.NoError(t, err)
	p = b.producer(t) // a client of its own would have to follow the new topic too
	for id := int64(10); id <= 12; id++ {
		produce(t, p, event("t", int32(id%3), id, "t.x", `{}`))
	}
	require.Eventually(t, func() bool { return len(b.effects(t)) == 12 }, 30*time.Second, 100*time.Millisecond,
		"the consumer did not follow the recreated topic within 30s")
	require.NoError(t, stop())
	for id, n := range b.effects(t) {
		require.Equal(t, 1, n, "event %s applied once", id)
	}
}
