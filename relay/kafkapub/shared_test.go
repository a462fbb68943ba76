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
// cluster). They publish one at a time: a Flush sends every record the
// client holds, and records of two batches sent as they are produced
// could overtake a refused record of their aggregate. While the broker
// refuses the first one's topic with an error a retry may fix, the second
// one's Publish waits for the first to end (here: its records time out),
// then goes through.
func TestSharedClientPublishersTakeTurns(t *testing.T) {
	t.Parallel()
	b, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	cl, err := kafkapub.NewSharedPublisherClient(kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(3 * time.Second)}})
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
	defer fault.Remove()
	stuckDone := make(chan []error, 1)
	go func() {
		stuckDone <- stuck.Publish(ctx, []relay.Message{msg(2, uuid.New(), "stuck", 10), msg(3, uuid.New(), "stuck", 10)})
	}()
	require.Eventually(t, func() bool { return fault.Hits() > 0 }, 10*time.Second, time.Millisecond, "the stuck publish never sent")
	errs := free.Publish(ctx, []relay.Message{msg(2, uuid.New(), "free", 10)})
	require.Equal(t, []error{nil}, errs, "the healthy topic's publish goes through once its turn comes")
	select {
	case errs := <-stuckDone:
		for _, err := range errs {
			require.Error(t, err, "the stuck records time out")
		}
	default:
		t.Fatal("the second publish ended before the first: publishers on a shared client must take turns")
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
