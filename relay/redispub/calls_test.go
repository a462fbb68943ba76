package redispub_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/redispub"
)

// A batch of 5,000 spans several script calls to one stream; an entry
// Redis refuses in one of them holds back only its aggregate's later
// entries, and the stream holds every other entry, each aggregate's in
// order.
func TestRefusalInALargeBatch(t *testing.T) {
	t.Parallel()
	s := startPrivate(t)
	proxy := startProxy(t, s.Addr())
	client := s.client()
	p, err := redispub.New(clientOf(t, proxy.Addr()), redispub.Config{})
	require.NoError(t, err)
	msgs := batch5000("large")
	refused := msgs[3777]
	proxy.add(func(args []string) ([]string, bool) {
		if c, ok := asPublishCall(args); ok {
			if at := c.entryAt(refused.ID); at >= 0 {
				return c.withExtraArg(at), false
			}
		}
		return args, false
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	held := 0
	for i, m := range msgs {
		switch {
		case m.ID == refused.ID:
			require.Equal(t, relay.ReasonBrokerRefused, relay.ReasonOf(errs[i]), errs[i])
		case m.AggregateID == refused.AggregateID && m.ID > refused.ID:
			require.Error(t, errs[i])
			require.False(t, relay.IsPermanent(errs[i]))
			held++
		default:
			require.NoError(t, errs[i], "message %d", m.ID)
		}
	}
	got := readStream(t, client, "large")
	require.Len(t, got, len(msgs)-1-held)
	last := map[string]int64{}
	for _, d := range got {
		require.NotEqual(t, refused.ID, d.ID)
		require.Greater(t, d.ID, last[d.Key], "aggregate %s out of order", d.Key)
		last[d.Key] = d.ID
	}
}
