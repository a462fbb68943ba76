package routing_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/routing"
)

func TestAMQPDestination(t *testing.T) {
	t.Parallel()
	key, err := routing.AMQP{}.Destination("order.placed")
	require.NoError(t, err)
	require.Equal(t, "order.placed", key)
	key, err = routing.AMQP{TopicPrefix: "shop."}.Destination("order.placed")
	require.NoError(t, err)
	require.Equal(t, "shop.order.placed", key)

	for _, c := range []struct{ typ, want string }{
		{"", "the type is empty"},
		{strings.Repeat("t", 256), "is 256 bytes; AMQP routing keys hold at most 255"},
		{"bad\xff", "not valid UTF-8"},
	} {
		_, err := routing.AMQP{}.Destination(c.typ)
		require.ErrorIs(t, err, outbox.ErrInvalidTopic, c.typ)
		require.ErrorContains(t, err, c.want)
	}
	_, err = routing.AMQP{TopicPrefix: strings.Repeat("p", 250)}.Destination("order.placed")
	require.ErrorContains(t, err, "is 262 bytes")
}

func TestAMQPSizeAndLimit(t *testing.T) {
	t.Parallel()
	a := routing.AMQP{}
	require.Equal(t, 1234, a.Size("order.placed", 1234, map[string]string{"h": "v"}))
	require.Equal(t, routing.DefaultAMQPMaxBytes, a.Limit().Bytes)
	require.Equal(t, 1000, routing.AMQP{MaxBytes: 1000}.Limit().Bytes)
	require.Contains(t, a.Limit().Raise, "max_message_size")
}

func TestAMQPValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, routing.AMQP{TopicPrefix: "shop."}.Validate())
	require.ErrorContains(t, routing.AMQP{MaxBytes: -1}.Validate(), "MaxBytes is -1")
	err := routing.AMQP{TopicPrefix: strings.Repeat("p", 255)}.Validate()
	require.ErrorContains(t, err, "TopicPrefix")
}
