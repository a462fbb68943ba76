package relay_test

import (
	"context"
	"fmt"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/contracts"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// ackAll is a publisher that acknowledges every message at once: with it a
// relayer's batch is the database's work alone (claim, mark, commit).
type ackAll struct{ fakesink.Kafka }

func (ackAll) Publish(_ context.Context, msgs []relay.Message) []error {
	return make([]error, len(msgs))
}

// benchPreload inserts n pending events over 1,000 aggregates and
// vacuums, as the bench tool's preload does.
func benchPreload(b *testing.B, db *pgtest.DB, n int) {
	b.Helper()
	ctx := context.Background()
	tbl := db.Tables.OutboxIdent()
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_id, type, payload)
		SELECT md5('aggregate-' || (g %% 1000))::uuid, 'order.placed',
		  jsonb_build_object('order_id', g, 'customer_id', 'customer-' || (g %% 1000), 'total_cents', (g * 7919) %% 100000, 'currency', 'EUR')
		FROM generate_series(1, $1) g`, tbl), n); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE "+tbl); err != nil {
		b.Fatal(err)
	}
}

// benchDrain preloads b.N full batches and times one relayer draining
// them: ns/op is one batch of 1,000 (claim, publish, mark, commit).
func benchDrain(b *testing.B, pub func(b *testing.B) relay.Sink, mod func(*relay.Config)) {
	const batch = 1000
	db := pgtest.New(b, pgtest.Options{MaxConns: 4})
	benchPreload(b, db, b.N*batch)
	var dispatched atomic.Int64
	cfg := relay.Config{
		Common: relay.Common{Pool: db.Pool, Sink: pub(b), Tables: db.Tables, BatchSize: batch, Logger: slog.New(slog.DiscardHandler),
			Hooks: []relay.Hook{onBatch(func(res relay.BatchResult) { dispatched.Add(int64(res.Dispatched)) })}},
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := relay.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.ResetTimer()
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(time.Minute + time.Duration(b.N)*time.Second)
	for dispatched.Load() < int64(b.N*batch) {
		if time.Now().After(deadline) {
			b.Fatalf("dispatched %d of %d events", dispatched.Load(), b.N*batch)
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkClaim is the relayer's database work per batch of 1,000: the
// one-statement claim-and-mark with the per-aggregate order rule, and the
// commit, against a publisher that acknowledges at once.
func BenchmarkClaim(b *testing.B) {
	benchDrain(b, func(*testing.B) relay.Sink { return ackAll{} }, nil)
}

// BenchmarkClaimContracts is BenchmarkClaim with every event checked
// against a contract (Common.Contracts) before it is "sent": the relay's
// share of the check's cost, on the preload's ~100-byte payload.
func BenchmarkClaimContracts(b *testing.B) {
	dir := b.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "order.placed"), 0o755); err != nil {
		b.Fatal(err)
	}
	schema := `{"type": "object", "required": ["order_id", "customer_id", "total_cents", "currency"], "additionalProperties": false,
  "properties": {"order_id": {"type": "integer", "minimum": 1}, "customer_id": {"type": "string", "pattern": "^customer-[0-9]+$"},
    "total_cents": {"type": "integer", "minimum": 0}, "currency": {"enum": ["EUR", "USD"]}}}`
	if err := os.WriteFile(filepath.Join(dir, "order.placed", "v1.schema.json"), []byte(schema), 0o644); err != nil {
		b.Fatal(err)
	}
	set, err := contracts.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	benchDrain(b, func(*testing.B) relay.Sink { return ackAll{} }, func(c *relay.Config) { c.Contracts = set })
}

// BenchmarkRelayBatch is a whole batch of 1,000 to an in-process kfake
// broker: claim, build records, produce and wait for the acks, mark,
// commit. Profile the relayer with
//
//	go test -run '^$' -bench RelayBatch -cpuprofile cpu.out ./relay/
func BenchmarkRelayBatch(b *testing.B) {
	benchDrain(b, devBroker, nil)
}

// BenchmarkRelayBatchRemoteBroker adds 5 ms to every publish, as a broker
// across a network with replicated acknowledgements (acks=all) takes, and
// compares the default (the next batch is claimed while one is published)
// with one batch at a time.
func BenchmarkRelayBatchRemoteBroker(b *testing.B) {
	for _, tc := range []struct {
		name   string
		serial bool
	}{{"pipelined", false}, {"serial", true}} {
		b.Run(tc.name, func(b *testing.B) {
			benchDrain(b, func(b *testing.B) relay.Sink {
				return slowPublisher{inner: devBroker(b), delay: 5 * time.Millisecond}
			}, func(c *relay.Config) { c.DisablePipelining = tc.serial })
		})
	}
}

type slowPublisher struct {
	fakesink.Kafka

	inner relay.Sink
	delay time.Duration
}

func (p slowPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	time.Sleep(p.delay)
	return p.inner.Publish(ctx, msgs)
}

// devBroker starts a kfake broker for the benchmark and returns a
// publisher to it.
func devBroker(b *testing.B) relay.Sink {
	broker, err := devkafka.Start(devkafka.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(broker.Close)
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{broker.Addr()}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(10 * time.Second)}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(client.Close)
	return kafkapub.NewPublisher(client, kafkapub.PublisherConfig{})
}
