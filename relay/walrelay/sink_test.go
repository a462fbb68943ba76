package walrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// The WAL source asks its sink, not Kafka's rules: it takes a TopicPrefix
// Kafka refuses and refuses one the sink refuses, fills Message.Topic from
// the sink's routing, and parks an event the routing gives no destination
// (though Kafka's would).
func TestWALRoutesWithTheSinksRouting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: b.db.Pool, Sink: &fakesink.PathSink{}, Tables: b.db.Tables, TopicPrefix: "shop:"}})
	require.ErrorContains(t, err, `relay: path prefix "shop:" holds a ':'`)

	sink := &fakesink.PathSink{}
	r := b.relayer(t, func(c *walrelay.Config) { c.Sink, c.TopicPrefix = sink, "shop/" })
	run(t, r)
	waitLeading(t, r)
	path, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables, Routing: fakesink.PathRouting{Prefix: "shop/"}})
	require.NoError(t, err)
	ctx := context.Background()
	emit := func(p *outbox.Producer, typ string) (id int64) {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			id, err = p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: typ, Payload: 1})
			return err
		}))
		return id
	}
	eu := emit(path, "orders-eu.placed")
	emit(b.producer, "order_eu.placed")
	us := emit(path, "orders-us.placed")

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		topics := map[int64]string{}
		for _, m := range sink.Got() {
			topics[m.ID] = m.Topic
		}
		assert.Equal(c, map[int64]string{eu: "shop/orders/eu", us: "shop/orders/us"}, topics)
		assert.Equal(c, int64(1), r.Stats().Parked, "the event the sink routes nowhere")
	}, 30*time.Second, 20*time.Millisecond)
}
