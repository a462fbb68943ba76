package redispub_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/redispub"
)

// batch5000 is a relay batch: 5,000 events over 1,000 aggregates, the
// bench preload's spread, with ~200-byte payloads.
func batch5000(topic string) []relay.Message {
	aggs := make([]uuid.UUID, 1000)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	out := make([]relay.Message, 5000)
	for i := range out {
		out[i] = relay.Message{ID: int64(i + 1), AggregateID: aggs[i%len(aggs)], Type: "order.placed", Topic: topic,
			Payload: fmt.Appendf(nil, `{"order_id": %d, "customer_id": "customer-%d", "currency": "EUR", "items": [{"sku": "SKU-1", "qty": 2, "price_cents": 1999}], "total_cents": 3998}`, i, i%1000)}
	}
	return out
}

// BenchmarkPublish5000 publishes a relay batch through the Publisher;
// BenchmarkPipelinedXAdd adds the same entries with plain pipelined XADD,
// go-redis alone: the Publisher's cost of keeping order.
func BenchmarkPublish5000(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer c.Close()
	p, err := redispub.New(c, redispub.Config{})
	if err != nil {
		b.Fatal(err)
	}
	msgs := batch5000("bench-" + uuid.NewString()[:8])
	defer c.Del(context.Background(), msgs[0].Topic)
	for b.Loop() {
		for _, err := range p.Publish(context.Background(), msgs) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkPipelinedXAdd(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer c.Close()
	msgs := batch5000("bench-" + uuid.NewString()[:8])
	defer c.Del(context.Background(), msgs[0].Topic)
	for b.Loop() {
		pipe := c.Pipeline()
		for _, m := range msgs {
			pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: m.Topic, Values: []any{"event_id", m.ID, "event_type", m.Type,
				"aggregate_id", m.AggregateID.String(), "content-type", "application/json", "payload", m.Payload}})
		}
		if _, err := pipe.Exec(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "events/s")
}
