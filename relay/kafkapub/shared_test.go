package kafkapub_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// Two publishers share one client (two outboxes relaying to one
// cluster). While the broker keeps refusing the first one's topic with an
// error a retry may fix, its Publish waits; the second one's Publish, to
// another topic, completes meanwhile, and again: it waits for its own
// records only, where a Flush would wait for every record the client
// holds. Once the fault is lifted the first one's records go through.
func TestSharedClientPublishersWaitForTheirOwnRecords(t *testing.T) {
	t.Parallel()
	b, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	cl, err := kafkapub.NewSharedPublisherClient(kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(2 * time.Minute)}})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	stuck, free := kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{Source: "stuck"}), kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{Source: "free"})
	ctx := context.Background()
	// Topics exist before the fault, so that only produce requests fail.
	for _, p := range []struct {
		pub   *kafkapub.Publisher
		topic string
	}{{stuck, "stuck"}, {free, "free"}} {
		require.Equal(t, []error{nil}, p.pub.Publish(ctx, []relay.Message{msg(1, uuid.New(), p.topic, 10)}))
	}

	fault := b.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "stuck", Err: kerr.NotEnoughReplicas, Count: -1})
	stuckDone := make(chan []error, 1)
	go func() {
		stuckDone <- stuck.Publish(ctx, []relay.Message{msg(2, uuid.New(), "stuck", 10), msg(3, uuid.New(), "stuck", 10)})
	}()
	for id := int64(2); id <= 4; id++ {
		errs := free.Publish(ctx, []relay.Message{msg(id, uuid.New(), "free", 10)})
		require.Equal(t, []error{nil}, errs, "publish %d to the healthy topic", id)
		select {
		case errs := <-stuckDone:
			t.Fatalf("the stuck publish returned %v while its topic still failed", errs)
		default:
		}
	}
	fault.Remove()
	select {
	case errs := <-stuckDone:
		require.Equal(t, []error{nil, nil}, errs, "the stuck records go through once the fault is lifted")
	case <-time.After(time.Minute):
		t.Fatal("the stuck publish did not complete within a minute of the fault's end")
	}
}

// A Publish on a shared client whose context ends while its records are
// out returns at once, those records failed with the context's error.
func TestSharedClientPublishEndsWithItsContext(t *testing.T) {
	t.Parallel()
	b, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	cl, err := kafkapub.NewSharedPublisherClient(kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(10 * time.Minute)}})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	pub := kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{})
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []relay.Message{msg(1, uuid.New(), "t", 10)}))
	b.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "t", Err: kerr.NotEnoughReplicas, Count: -1})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	errs := pub.Publish(ctx, []relay.Message{msg(2, uuid.New(), "t", 10)})
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], context.Canceled)
}
