package kafkapub_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// msg builds a message with a random (incompressible) payload of n bytes.
func msg(id int64, agg uuid.UUID, topic string, n int) relay.Message {
	raw := make([]byte, n/2+1)
	_, _ = rand.Read(raw)
	return relay.Message{ID: id, AggregateID: agg, Type: topic + ".x", Topic: topic,
		Payload: []byte(`"` + hex.EncodeToString(raw)[:n] + `"`)}
}

func publisher(t *testing.T, brokerMax, override int, plain bool) (*kafkapub.Publisher, *devkafka.Broker) {
	t.Helper()
	b, err := devkafka.Start(devkafka.Config{Partitions: 1, MaxMessageBytes: brokerMax})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	cfg := kafka.ClientConfig{Brokers: []string{b.Addr()}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}}
	var cl *kgo.Client
	if plain {
		opts, err := cfg.Options()
		require.NoError(t, err)
		cl, err = kgo.NewClient(append(append(kafka.ProducerOptions(), kgo.ManualFlushing()), opts...)...)
		require.NoError(t, err)
	} else {
		cl, err = kafkapub.NewPublisherClient(cfg)
		require.NoError(t, err)
	}
	t.Cleanup(cl.Close)
	return kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{MaxMessageBytes: override}), b
}

// One oversized record among healthy ones, all in one partition: only the
// culprit fails, with the reason too_large; the record of its aggregate
// behind it is not sent; every other record is acknowledged. Whether the
// publisher refuses it before sending (it learnt the broker's limit) or the
// broker refuses the partition's whole request (the publisher was told a
// larger limit, or the client batches up to 1 MB), and the request is split
// until the culprit is alone.
func TestPublishBlamesOnlyTheCulprit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		override int
		plain    bool
	}{
		{"refused before sending", 0, false},
		{"broker refuses the request", 1 << 20, false},
		{"client batches of 1 MB", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pub, _ := publisher(t, 20_000, tc.override, tc.plain)
			a, others := uuid.New(), uuid.New()
			var msgs []relay.Message
			for i := range 8 {
				msgs = append(msgs, msg(int64(i+1), others, "t", 3_000))
			}
			msgs = append(msgs, msg(9, a, "t", 30_000), msg(10, a, "t", 100))
			for i := range 8 {
				msgs = append(msgs, msg(int64(11+i), uuid.New(), "t", 3_000))
			}
			errs := pub.Publish(context.Background(), msgs)
			require.Len(t, errs, len(msgs))
			for i, err := range errs {
				switch msgs[i].ID {
				case 9:
					require.True(t, relay.IsPermanent(err), "the culprit: %v", err)
					require.Equal(t, relay.ReasonTooLarge, relay.ReasonOf(err))
					require.True(t, errors.Is(err, kerr.MessageTooLarge), "%v", err)
				case 10:
					require.Error(t, err, "the record behind the culprit must not be acknowledged")
					require.False(t, relay.IsPermanent(err), "and it is not a failure of its own: %v", err)
				default:
					require.NoError(t, err, "record %d rode along and must go through", msgs[i].ID)
				}
			}
		})
	}
}

// The limit comes from the topic's own max.message.bytes when it sets one,
// else from the broker's message.max.bytes; PublisherConfig.MaxMessageBytes
// overrides both. The error says which and what to do.
func TestPublishLearnsTopicLimits(t *testing.T) {
	t.Parallel()
	pub, b := publisher(t, 50_000, 0, false)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	_, err = adm.CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": kadm.StringPtr("10000")}, "small")
	require.NoError(t, err)

	errs := pub.Publish(context.Background(), []relay.Message{msg(1, uuid.New(), "small", 12_000), msg(2, uuid.New(), "big", 12_000), msg(3, uuid.New(), "big", 60_000)})
	require.ErrorContains(t, errs[0], `topic "small" accepts at most 10000 (the topic's max.message.bytes)`)
	require.NoError(t, errs[1])
	require.ErrorContains(t, errs[2], `topic "big" accepts at most 50000 (the broker's message.max.bytes)`)
	require.ErrorContains(t, errs[2], "Raise the topic's max.message.bytes and retry the row")

	size := outbox.KafkaRouting{}.RecordSize(3, "big.x", 60_002, nil, "")
	require.ErrorContains(t, errs[2], "the record is "+strconv.Itoa(size)+" bytes")
}

// With PublisherConfig.MaxMessageBytes the error names that setting, not a
// flag of the CLI: the library does not know how it was configured.
func TestPublishOverrideNamesTheSetting(t *testing.T) {
	t.Parallel()
	pub, _ := publisher(t, 50_000, 10_000, false)
	errs := pub.Publish(context.Background(), []relay.Message{msg(1, uuid.New(), "t", 12_000)})
	require.ErrorContains(t, errs[0], "accepts at most 10000 (PublisherConfig.MaxMessageBytes)")
	require.NotContains(t, errs[0].Error(), "--")
}
