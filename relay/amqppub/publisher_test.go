package amqppub_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/amqppub"
	"github.com/pgoutbox/outbox/routing"
)

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  amqppub.Config
		want string
	}{
		{amqppub.Config{}, "URL is required"},
		{amqppub.Config{URL: "http://host"}, "is not an AMQP URL"},
		{amqppub.Config{URL: "amqp://u:s3cret@"}, "is not an AMQP URL"},
		{amqppub.Config{URL: "amqp://h", Exchange: strings.Repeat("e", 256)}, "Exchange is 256 bytes"},
		{amqppub.Config{URL: "amqp://h", Source: strings.Repeat("s", outbox.MaxSourceLen+1)}, "Source"},
		{amqppub.Config{URL: "amqp://h", MaxBytes: -1}, "must not be negative"},
	} {
		_, err := amqppub.New(c.cfg)
		require.ErrorContains(t, err, c.want)
		require.NotContains(t, err.Error(), "s3cret")
	}
	cfg := amqppub.Config{URL: "amqp://h"}.WithDefaults()
	require.Equal(t, amqppub.DefaultExchange, cfg.Exchange)
	require.Equal(t, amqppub.DefaultMaxBytes, cfg.MaxBytes)
	require.NoError(t, cfg.Validate())
}

// The sink's routing is routing.AMQP with its MaxBytes, so producers and
// the relayer agree.
func TestRouting(t *testing.T) {
	t.Parallel()
	pub, err := amqppub.New(amqppub.Config{URL: "amqp://h", MaxBytes: 5000})
	require.NoError(t, err)
	r, err := pub.Routing("shop.")
	require.NoError(t, err)
	require.Equal(t, routing.AMQP{TopicPrefix: "shop.", MaxBytes: 5000}, r)
	_, err = pub.Routing(strings.Repeat("p", 300))
	require.ErrorContains(t, err, "TopicPrefix")
}

// A server that cannot be reached fails every message, for a retry, with
// a code that says so.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	pub, err := amqppub.New(amqppub.Config{URL: "amqp://guest:s3cret@127.0.0.1:1/", ConnectTimeout: time.Second})
	require.NoError(t, err)
	errs := pub.Publish(context.Background(), []relay.Message{{ID: 1, AggregateID: uuid.New(), Type: "t", Topic: "t", Payload: []byte(`{}`)}})
	require.Error(t, errs[0])
	require.False(t, relay.IsPermanent(errs[0]))
	require.Equal(t, "unreachable", pub.ErrorCode(errs[0]))
	require.NotContains(t, errs[0].Error(), "s3cret")
	require.Error(t, pub.Ping(context.Background()))
}

// A row whose own headers use aggregate_id, which the sink sets, is held
// alone; a routing key over 255 bytes too.
func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	pub, q := bound(t, rabbittest.URL(), amqppub.Config{})
	a, b := uuid.New(), uuid.New()
	msgs := []relay.Message{
		{ID: 1, AggregateID: a, Type: "t", Topic: q, Payload: []byte(`{}`), Headers: map[string]string{outbox.HeaderAggregateID: "x"}},
		{ID: 2, AggregateID: a, Type: "t", Topic: q, Payload: []byte(`{}`)},
		{ID: 3, AggregateID: b, Type: "t", Topic: strings.Repeat("k", 256), Payload: []byte(`{}`)},
		{ID: 4, AggregateID: uuid.New(), Type: "t", Topic: q, Payload: []byte(`{}`)},
	}
	errs := pub.Publish(context.Background(), msgs)
	require.Equal(t, relay.ReasonReservedHeader, relay.ReasonOf(errs[0]), errs[0])
	require.Error(t, errs[1])
	require.False(t, relay.IsPermanent(errs[1]))
	require.Equal(t, relay.ReasonInvalidTopic, relay.ReasonOf(errs[2]), errs[2])
	require.NoError(t, errs[3])
}

// bound returns a publisher on url and a routing key a durable queue is
// bound for on its exchange.
func bound(t *testing.T, url string, cfg amqppub.Config) (*amqppub.Publisher, string) {
	t.Helper()
	conn := rabbittest.Dial(t, url)
	ch := rabbittest.Channel(t, conn)
	key := "amqppub-test-" + uuid.NewString()
	cfg.URL = url
	if cfg.Exchange == "" {
		cfg.Exchange = key
	}
	pub, err := amqppub.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	require.NoError(t, pub.Ping(context.Background()))
	_, err = ch.QueueDeclare(key, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(key, key, cfg.Exchange, false, nil))
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(key, false, false, false)
		_ = ch.ExchangeDelete(cfg.Exchange, false, false)
	})
	return pub, key
}

// On a private node: a body over the server's max_message_size, which
// the Publisher was not told, is refused by the server (it closes the
// channel); the Publisher blames that message alone, permanently, learns
// the server's figure, and refuses the next such body before sending it.
// Then the node is killed: messages fail for a retry, and once the node
// is back the Publisher reconnects on its own and delivers them. Then a
// memory alarm blocks publishing, and Publish still returns in time.
func TestPrivateNode(t *testing.T) {
	t.Parallel()
	node := rabbittest.StartNode(t, rabbittest.NodeOptions{MaxMessageSize: 50_000})
	pub, q := bound(t, node.URL(), amqppub.Config{ConfirmTimeout: 3 * time.Second})
	ctx := context.Background()
	a, b := uuid.New(), uuid.New()
	big := []byte(`{"pad": "` + strings.Repeat("x", 60_000) + `"}`)
	msg := func(id int64, agg uuid.UUID, body []byte) relay.Message {
		return relay.Message{ID: id, AggregateID: agg, Type: "t", Topic: q, Payload: body}
	}
	errs := pub.Publish(ctx, []relay.Message{msg(1, a, []byte(`{}`)), msg(2, a, big), msg(3, a, []byte(`{}`)), msg(4, b, []byte(`{}`))})
	require.NoError(t, errs[0])
	require.Equal(t, relay.ReasonTooLarge, relay.ReasonOf(errs[1]), errs[1])
	require.ErrorContains(t, errs[1], "max_message_size of 50000")
	require.Error(t, errs[2])
	require.False(t, relay.IsPermanent(errs[2]))
	// Message 4 may have been in flight when the channel closed: then it
	// fails for a retry.
	if errs[3] != nil {
		require.False(t, relay.IsPermanent(errs[3]), errs[3])
	}
	errs = pub.Publish(ctx, []relay.Message{msg(5, b, big), msg(6, a, []byte(`{}`))})
	require.ErrorContains(t, errs[0], "at most 50000")
	require.NoError(t, errs[1])

	node.Kill()
	errs = pub.Publish(ctx, []relay.Message{msg(7, a, []byte(`{}`))})
	require.Error(t, errs[0])
	require.False(t, relay.IsPermanent(errs[0]), errs[0])
	node.Start()
	// Right after a restart the server may take connections before it has
	// recovered its bindings, and return a message as unroutable for a
	// moment: the relayer holds such a row and retries it after the hold.
	require.Eventually(t, func() bool { return pub.Publish(ctx, []relay.Message{msg(7, a, []byte(`{}`))})[0] == nil },
		90*time.Second, 100*time.Millisecond, "publishes once the node is back") // an Erlang node restarts slowly on a loaded machine

	// A memory alarm blocks publishers: the server stops reading and
	// confirming. Publish gives up within ConfirmTimeout, for a retry,
	// and publishes again once the alarm clears.
	node.Ctl("set_vm_memory_high_watermark", "0")
	errs = pub.Publish(ctx, []relay.Message{msg(8, a, []byte(`{}`))})
	require.Error(t, errs[0])
	require.False(t, relay.IsPermanent(errs[0]), errs[0])
	node.Ctl("set_vm_memory_high_watermark", "0.4")
	require.Eventually(t, func() bool { return pub.Publish(ctx, []relay.Message{msg(8, a, []byte(`{}`))})[0] == nil },
		60*time.Second, 100*time.Millisecond, "publishes once the alarm is cleared")

	conn := rabbittest.Dial(t, node.URL())
	var ids []string
	for _, d := range rabbittest.Get(t, conn, q, 4, 200*time.Millisecond, 20*time.Second) {
		ids = append(ids, d.MessageId)
	}
	require.Subset(t, ids, []string{"1", "6", "7", "8"})
	require.NotContains(t, ids, "2")
}
