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

// One aggregate's records fill many produce requests to its partition
// (a small batch limit). The broker refuses, for good, the request that
// carries one of them: no later record of the aggregate may be
// acknowledged, on a publisher's own client or on a shared one, where
// records go out as they are produced. With several requests in flight
// to a partition, the broker accepted the next request after refusing
// one, and a later event landed ahead of an earlier one it kept waiting.
func TestRefusedRequestLetsNoLaterRecordOfItsAggregateThrough(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		newClient func(kafka.ClientConfig) (*kgo.Client, error)
	}{
		{"own client", kafkapub.NewPublisherClient},
		{"shared client", kafkapub.NewSharedPublisherClient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := devkafka.Start(devkafka.Config{Partitions: 1, MaxMessageBytes: 4_000})
			require.NoError(t, err)
			t.Cleanup(b.Close)
			cl, err := tc.newClient(kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{
				kgo.RecordDeliveryTimeout(5 * time.Second), kgo.ProducerBatchCompression(kgo.NoCompression()),
			}})
			require.NoError(t, err)
			t.Cleanup(cl.Close)
			pub := kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{})
			agg := uuid.New()
			var batch []relay.Message
			for i := range 200 {
				batch = append(batch, msg(int64(i+1), agg, "order", 300))
			}
			refused := int64(60)
			b.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, Topic: "order", Err: kerr.InvalidRecord, When: carries(refused)})
			errs := pub.Publish(context.Background(), batch)
			for i, m := range batch {
				switch {
				case m.ID < refused:
					require.NoError(t, errs[i], "record %d comes before the refused one", m.ID)
				case m.ID == refused:
					require.True(t, relay.IsPermanent(errs[i]), "record %d is to blame: %v", m.ID, errs[i])
				default:
					require.Error(t, errs[i], "record %d was acknowledged after record %d of its aggregate was refused", m.ID, refused)
				}
			}
		})
	}
}
