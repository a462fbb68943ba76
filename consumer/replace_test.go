package consumer_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
)

// A broker replaced under a running consumer (stopped, and a new one with
// no data started on the same address: the topic has a new id, as when it
// is deleted and recreated) is followed by the consumer itself: the events
// written to the new broker are processed, each once, within 30s, and none
// is skipped for an offset of the old topic.
func TestConsumerFollowsAReplacedBroker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addr := kafkatest.FreeAddr(t)
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

// On a broker that takes offset commits by topic name (Kafka before 4.2),
// the offset a consumer commits for a record of a topic's old incarnation,
// after the topic was deleted and recreated but before the consumer learnt
// the new id, lands on the new topic. Here a handler holds a record of
// the old topic (partition 0, offset 5) while the topic is recreated and
// filled, and the broker holds the consumer's fetches, so the client sees
// no new id until the held record's offset (6) was committed. Every record
// of the new topic is still processed, from its first offset.
func TestConsumerReadsARecreatedTopicFromItsStartDespiteOldOffsets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	kb, err := devkafka.Start(devkafka.Config{Partitions: 3, Opts: []kfake.Opt{
		kfake.MaxVersions(kversion.V4_1_0()), // OffsetCommit v9: by topic name
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
	}})
	require.NoError(t, err)
	t.Cleanup(kb.Close)
	b.broker = kb

	blocked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold := func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		once.Do(func() {
			close(blocked)
			<-release
		})
		return record(ctx, tx, ev)
	}
	c, err := consumer.New(b.config(map[string]consumer.Handler{"t.x": record, "t.hold": hold}))
	require.NoError(t, err)
	stop := run(t, c)

	p := b.producer(t)
	ids := func(p int32, from, n int64) (recs []*kgo.Record) {
		for id := from; id < from+n; id++ {
			recs = append(recs, event("t", p, id, "t.x", `{}`))
		}
		return recs
	}
	for part := int32(0); part < 3; part++ {
		produce(t, p, ids(part, 100*int64(part)+1, 5)...) // offsets 0-4
	}
	require.Eventually(t, func() bool { return len(b.effects(t)) == 15 }, 20*time.Second, 50*time.Millisecond)
	produce(t, p, event("t", 0, 6, "t.hold", `{}`))
	select {
	case <-blocked:
	case <-time.After(20 * time.Second):
		t.Fatal("the held record was not consumed within 20s")
	}

	// Hold every fetch from here until the commit of offset 6 is in:
	// a fetch failing with UNKNOWN_TOPIC_ID would show the client the
	// new id (and franz-go then commits nothing of the old topic).
	fetchHeld, fetchGo := make(chan struct{}), make(chan struct{})
	var heldOnce sync.Once
	kb.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		select {
		case <-fetchGo:
			kb.DropControl()
			return nil, nil, false
		default:
		}
		kb.KeepControl()
		heldOnce.Do(func() { close(fetchHeld) })
		kb.SleepControl(func() { <-fetchGo })
		return nil, nil, false
	})
	select {
	case <-fetchHeld:
	case <-time.After(20 * time.Second):
		t.Fatal("no fetch within 20s")
	}

	require.NoError(t, kb.DeleteTopic("t"))
	require.NoError(t, kb.CreateTopic("t", 3, nil))
	p = b.producer(t)
	// More records on partition 0 of the new topic than the old offset.
	for part := int32(0); part < 3; part++ {
		produce(t, p, ids(part, 1000*int64(part+1), 12)...)
	}
	close(release)
	adm := kadm.NewClient(p)
	require.Eventually(t, func() bool {
		os, err := adm.FetchOffsets(context.Background(), "test")
		if err != nil {
			return false
		}
		o, ok := os.Lookup("t", 0)
		return ok && o.At == 6
	}, 20*time.Second, 20*time.Millisecond, "the old topic's offset 6 was not committed to the new one")
	close(fetchGo)

	want := 15 + 1 + 36
	if !assert.Eventually(t, func() bool { return len(b.effects(t)) >= want }, 30*time.Second, 100*time.Millisecond,
		"records of the recreated topic were skipped") {
		t.Logf("effects: %v", b.effects(t))
	}
	require.NoError(t, stop())
	eff := b.effects(t)
	for part := int64(0); part < 3; part++ {
		for id := 1000 * (part + 1); id < 1000*(part+1)+12; id++ {
			require.Equal(t, 1, eff["/"+strconv.FormatInt(id, 10)], "new topic's event %d applied once", id)
		}
	}
	require.Len(t, eff, want)
}
