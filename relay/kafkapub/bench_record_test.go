package kafkapub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// benchMessages are n outbox messages over 1,000 aggregates with ~200-byte
// payloads and one user header, as the relayer hands them over.
func benchMessages(n int) []relay.Message {
	msgs := make([]relay.Message, n)
	now := time.Now()
	for i := range msgs {
		msgs[i] = relay.Message{
			ID:          int64(i + 1),
			AggregateID: uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "aggregate-%d", i%1000)),
			Type:        "order.placed",
			Topic:       "order",
			Payload:     fmt.Appendf(nil, `{"order_id": %d, "customer_id": "customer-%d", "total_cents": %d, "currency": "EUR", "items": [{"sku": "SKU-%d", "qty": 1, "price_cents": 1999}]}`, i, i%1000, i*7919%100000, i%97),
			Headers:     map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			CreatedAt:   now,
		}
	}
	return msgs
}

// BenchmarkRecord is building one Kafka record from an outbox message:
// headers, key, value.
func BenchmarkRecord(b *testing.B) {
	msgs := benchMessages(1000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		_ = kafkapub.Record(msgs[i%len(msgs)], "orders-db")
		i++
	}
}

// BenchmarkPublish is one relayer batch of 1,000 messages produced to an
// in-process kfake broker, waiting for every acknowledgement. The variants
// are franz-go options the relayer could set; "defaults" is what
// NewPublisherClient sets today.
func BenchmarkPublish(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []kgo.Opt
	}{
		{"defaults", nil},
		{"no-compression", []kgo.Opt{kgo.ProducerBatchCompression(kgo.NoCompression())}},
		{"linger-1ms", []kgo.Opt{kgo.ProducerLinger(time.Millisecond)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			broker, err := devkafka.Start(devkafka.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer broker.Close()
			client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{broker.Addr()}, Opts: bc.opts})
			if err != nil {
				b.Fatal(err)
			}
			defer client.Close()
			pub := kafkapub.NewPublisher(client, kafkapub.PublisherConfig{})
			msgs := benchMessages(1000)
			ctx := context.Background()
			// The first batch creates the topic and the producer id.
			for _, err := range pub.Publish(ctx, msgs) {
				if err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				for _, err := range pub.Publish(ctx, msgs) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "events/s")
		})
	}
}
