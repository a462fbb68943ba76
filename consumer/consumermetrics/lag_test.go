package consumermetrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/consumermetrics"
	"github.com/pgoutbox/outbox/devkafka"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// The lag per partition is the high watermark minus the group's committed
// offset, read from the broker at each scrape.
func TestConsumerLagPerPartition(t *testing.T) {
	t.Parallel()
	b, err := devkafka.Start(devkafka.Config{Partitions: 2})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.DefaultProduceTopic("orders"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	_, err = adm.CreateTopic(ctx, 2, 1, nil, "orders")
	require.NoError(t, err)
	for i := range 5 {
		p := int32(0)
		if i >= 3 {
			p = 1
		}
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x"), Partition: p}).FirstErr())
	}
	// The group committed 1 of partition 0's 3 records and 2 of partition
	// 1's 2.
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "orders", Partition: 0, At: 1, LeaderEpoch: -1})
	offs.Add(kadm.Offset{Topic: "orders", Partition: 1, At: 2, LeaderEpoch: -1})
	_, err = adm.CommitOffsets(ctx, "loyalty-group", offs)
	require.NoError(t, err)

	m := consumermetrics.New("loyalty", func() consumer.Stats { return consumer.Stats{} })
	m.WatchLag("loyalty-group", adm)
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	code, body := get(t, srv.URL+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `outbox_consumer_lag{consumer="loyalty",group="loyalty-group",partition="0",topic="orders"} 2`)
	require.Contains(t, body, `outbox_consumer_lag{consumer="loyalty",group="loyalty-group",partition="1",topic="orders"} 0`)
	require.Contains(t, body, `outbox_consumer_lag_errors_total{consumer="loyalty",group="loyalty-group"} 0`)

	// A broker that does not answer: the lag is left out and counted.
	b.Close()
	_, body = get(t, srv.URL+"/metrics")
	require.NotContains(t, body, "outbox_consumer_lag{")
	require.Contains(t, body, `outbox_consumer_lag_errors_total{consumer="loyalty",group="loyalty-group"} 1`)
}

// /readyz answers 200 while every check passes and 503 naming the one
// that fails.
func TestConsumerReadiness(t *testing.T) {
	t.Parallel()
	var dbErr error
	m := consumermetrics.New("loyalty", func() consumer.Stats { return consumer.Stats{} })
	srv := httptest.NewServer(m.Handler(
		consumermetrics.ReadyCheck{Name: "database", Check: func(context.Context) error { return dbErr }},
		consumermetrics.ReadyCheck{Name: "broker", Check: func(context.Context) error { return nil }},
	))
	t.Cleanup(srv.Close)
	code, body := get(t, srv.URL+"/readyz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "database: ok\nbroker: ok\n", body)
	dbErr = errors.New("connection refused")
	code, body = get(t, srv.URL+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "database: not ready: connection refused\nbroker: ok\n", body)
}
