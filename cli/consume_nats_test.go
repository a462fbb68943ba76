package cli

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/routing"
)

// consume --sink nats://...?stream= reads the stream the relay's NATS sink
// publishes to through a durable consumer, and handles each event once
// per name: a second run under the same name prints nothing.
func TestConsumeNATSSink(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	natstest.AddStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"shop.>"}})
	want := emitRouted(t, db, routing.NATS{TopicPrefix: "shop."}, "order.placed", 20)

	relay := startCommand(t, db, "relay", "--sink", srv.URL(), "--topic-prefix", "shop.", "--poll-interval", "50ms", "--cleanup-interval", "0")
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, relay.stop())

	sink := srv.URL() + "?stream=ORDERS"
	c := startCommand(t, db, "consume", "--sink", sink, "--topics", "shop.order.>", "--name", "billing", "--json")
	require.Eventually(t, func() bool { return len(c.lines()) >= len(want) }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, c.stop())
	require.Equal(t, want, consumedIDs(t, c.lines()))

	again := startCommand(t, db, "consume", "--sink", sink, "--topics", "shop.order.>", "--name", "billing", "--json")
	time.Sleep(time.Second)
	require.NoError(t, again.stop())
	require.Empty(t, again.lines(), "everything was handled under this name")

	code, _, stderr := runCLI(t, db, "consume", "--sink", srv.URL(), "--name", "billing")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "?stream=NAME: name the JetStream stream to consume")
}
