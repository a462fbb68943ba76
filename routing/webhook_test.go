package routing_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/routing"
)

func TestWebhookDestination(t *testing.T) {
	t.Parallel()
	w := routing.Webhook{TopicPrefix: "shop."}
	d, err := w.Destination("order.placed")
	require.NoError(t, err)
	require.Equal(t, "shop.order", d)
	d, err = routing.Webhook{}.Destination("order")
	require.NoError(t, err)
	require.Equal(t, "order", d)
	for _, bad := range []string{"", ".placed", "ord er.placed", "ordér.placed"} {
		_, err := w.Destination(bad)
		require.True(t, errors.Is(err, outbox.ErrInvalidTopic), "%q: %v", bad, err)
	}
}

func TestWebhookSizeAndLimit(t *testing.T) {
	t.Parallel()
	w := routing.Webhook{}
	small := w.Size("order.placed", 10, nil)
	require.Greater(t, small, 10)
	require.Equal(t, small+len("tenant")+len("a")+4, w.Size("order.placed", 10, map[string]string{"tenant": "a"}))
	require.Equal(t, small+len("tenant")+len("Gr%C3%BC%C3%9Fe")+4, w.Size("order.placed", 10, map[string]string{"tenant": "Grüße"}), "values count encoded")
	require.Less(t, w.Size("order.placed", 10, nil), routing.Webhook{Signatures: 5}.Size("order.placed", 10, nil), "each signature counts")
	require.Equal(t, routing.DefaultWebhookMaxBytes, w.Limit().Bytes)
	require.Equal(t, 5000, routing.Webhook{MaxBytes: 5000}.Limit().Bytes)
}

func TestWebhookValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, routing.Webhook{TopicPrefix: "prod-"}.Validate())
	require.ErrorContains(t, routing.Webhook{TopicPrefix: "pro d"}.Validate(), "TopicPrefix")
	require.ErrorContains(t, routing.Webhook{MaxBytes: 10}.Validate(), "MaxBytes is 10")
	require.ErrorContains(t, routing.Webhook{Signatures: -1}.Validate(), "Signatures")
}
