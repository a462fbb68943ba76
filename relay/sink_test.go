package relay_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
)

// The relayer asks its sink, not Kafka's rules: it takes a TopicPrefix
// Kafka refuses and refuses one the sink refuses, fills Message.Topic from
// the sink's routing, holds a row the routing gives no destination (though
// Kafka's would), and reports each failure with the sink's code.
func TestRelayRoutesWithTheSinksRouting(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	_, err := relay.New(relay.Config{Common: relay.Common{Pool: db.Pool, Sink: &fakesink.PathSink{}, TopicPrefix: "shop:"}})
	require.ErrorContains(t, err, `relay: path prefix "shop:" holds a ':'`)

	path, err := outbox.NewProducer(outbox.Config{Tables: db.Tables, Routing: fakesink.PathRouting{Prefix: "shop/"}})
	require.NoError(t, err)
	kafka, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	pb, kb := &bundle{db: db, producer: path}, &bundle{db: db, producer: kafka}
	eu := pb.emit(t, uuid.New(), "orders-eu.placed", 1)
	us := pb.emit(t, uuid.New(), "orders-us.placed", 2)
	noPath := kb.emit(t, uuid.New(), "order_eu.placed", 3)

	sink := &fakesink.PathSink{FailOnce: map[int64]bool{us: true}}
	rec := &recordingHook{calls: new([]string)}
	r, err := relay.New(relay.Config{
		Common: relay.Common{Pool: db.Pool, Sink: sink, Tables: db.Tables, TopicPrefix: "shop/",
			BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Hooks: []relay.Hook{rec}},
		PollInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err, "the sink's routing takes a prefix with '/'")
	run(t, r)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		topics := map[int64]string{}
		for _, m := range sink.Got() {
			topics[m.ID] = m.Topic
		}
		assert.Equal(c, map[int64]string{eu: "shop/orders/eu", us: "shop/orders/us"}, topics)
	}, 20*time.Second, 20*time.Millisecond)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	byID := map[int64]relay.PublishFailure{}
	for _, f := range rec.failures {
		byID[f.Message.ID] = f
	}
	require.True(t, byID[noPath].Refused, "the relayer refused the row its sink routes nowhere")
	require.Equal(t, relay.ReasonInvalidTopic, relay.ReasonOf(byID[noPath].Err))
	require.ErrorContains(t, byID[noPath].Err, `type "order_eu.placed" names no path`)
	require.Empty(t, byID[noPath].Code)
	require.False(t, byID[us].Refused)
	require.Equal(t, "path_error", byID[us].Code, "the code is the sink's")
}
