package walrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// BenchmarkDrainBacklog drains a 50,000-event backlog (5,000 aggregates,
// one INSERT statement) with the WAL source and with the polling relay,
// on the same throwaway cluster and broker, and reports both rates:
//
//	go test -run - -bench DrainBacklog -benchtime 1x ./relay/walrelay
func BenchmarkDrainBacklog(b *testing.B) {
	const events = 50_000
	url := needLogicalB(b)
	broker, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(b, err)
	defer broker.Close()
	newPub := func() relay.Sink {
		client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{broker.Addr()}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(30 * time.Second)}})
		require.NoError(b, err)
		b.Cleanup(client.Close)
		return kafkapub.NewPublisher(client, kafkapub.PublisherConfig{})
	}
	fill := func(db *pgtest.DB) {
		_, err := db.Pool.Exec(context.Background(), `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload)
			SELECT md5((g % 5000)::text)::uuid, 'bench.event', jsonb_build_object('n', g, 'pad', repeat('x', 100)) FROM generate_series(1, $1) g`, events)
		require.NoError(b, err)
	}
	for range b.N {
		// WAL source
		db := pgtest.New(b, pgtest.Options{MaxConns: 8, ServerURL: url})
		slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
		require.NoError(b, walrelay.Setup(context.Background(), db.Pool, db.Tables, slot, slot))
		fill(db)
		r, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: db.Pool, Sink: newPub(), Tables: db.Tables}})
		require.NoError(b, err)
		ctx, cancel := context.WithCancel(context.Background())
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		for r.Stats().Dispatched < events {
			time.Sleep(5 * time.Millisecond)
		}
		wal := time.Since(start)
		cancel()
		require.NoError(b, <-done)
		require.NoError(b, walrelay.Teardown(context.Background(), db.Pool, slot, slot))

		// Polling relay, same cluster, same broker
		db2 := pgtest.New(b, pgtest.Options{MaxConns: 8, ServerURL: url})
		fill(db2)
		pr, err := relay.New(relay.Config{Common: relay.Common{Pool: db2.Pool, Sink: newPub(), Tables: db2.Tables}})
		require.NoError(b, err)
		ctx2, cancel2 := context.WithCancel(context.Background())
		start = time.Now()
		done2 := make(chan error, 1)
		go func() { done2 <- pr.Run(ctx2) }()
		for pr.Stats().Dispatched < events {
			time.Sleep(5 * time.Millisecond)
		}
		poll := time.Since(start)
		cancel2()
		require.NoError(b, <-done2)
		b.ReportMetric(events/wal.Seconds(), "wal_events/s")
		b.ReportMetric(events/poll.Seconds(), "poll_events/s")
	}
}

func needLogicalB(b *testing.B) string {
	if logicalErr != nil {
		b.Skipf("skipped: needs a throwaway cluster with wal_level=logical: %v", logicalErr)
	}
	return logical.URL()
}
