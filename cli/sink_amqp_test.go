package cli

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/rabbittest"
)

func TestAMQPSinkURL(t *testing.T) {
	t.Parallel()
	parse := func(raw, pw string) (string, string, int, error) {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		cfg, err := amqpConfig(u, pw)
		return cfg.URL, cfg.Exchange, cfg.MaxBytes, err
	}
	got, ex, n, err := parse("amqp://guest:guest@127.0.0.1:5672/shop?exchange=events&max_bytes=1000&heartbeat=5", "")
	require.NoError(t, err)
	require.Equal(t, "amqp://guest:guest@127.0.0.1:5672/shop?heartbeat=5", got)
	require.Equal(t, "events", ex)
	require.Equal(t, 1000, n)

	got, _, _, err = parse("amqps://relay@rabbit:5671/", "s3cret")
	require.NoError(t, err)
	require.Equal(t, "amqps://relay:s3cret@rabbit:5671/", got, "the password comes from the environment")
	got, _, _, err = parse("amqp://relay:inurl@rabbit/", "s3cret")
	require.NoError(t, err)
	require.Contains(t, got, ":inurl@", "a password in the URL wins")

	for raw, want := range map[string]string{
		"amqp:///vhost":             "names no host",
		"amqp://h/?exchange=":       "?exchange= is empty",
		"amqp://h/?max_bytes=-1":    "?max_bytes=-1 is not a positive number",
		"amqp://h/?exchnage=events": `unknown parameter "exchnage"`,
	} {
		_, _, _, err := parse(raw, "")
		require.ErrorContains(t, err, want, raw)
	}
}

// --sink amqp:// publishes through the RabbitMQ sink: every row reaches a
// queue bound to the exchange the URL names, and the relay marks it
// dispatched.
func TestRelayAMQPSinkPublishes(t *testing.T) {
	t.Parallel()
	conn := rabbittest.Dial(t, rabbittest.URL())
	ch := rabbittest.Channel(t, conn)
	name := "cli-test-" + uuid.NewString()
	require.NoError(t, ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil))
	_, err := ch.QueueDeclare(name, false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(name, "order.*", name, false, nil))
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})
	db := pgtest.New(t)
	_, err = db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) SELECT gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, 50)")
	require.NoError(t, err)

	relayUntilDispatched(t, db, "--sink", rabbittest.URL()+"?exchange="+name)
	require.Len(t, rabbittest.Get(t, conn, name, 50, 200*time.Millisecond, 20*time.Second), 50)
}
