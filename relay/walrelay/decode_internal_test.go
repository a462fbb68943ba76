package walrelay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
)

// A message-mode event's time is its commit's: the writer's created_at is
// not taken.
func TestMessageEventTimeIsTheCommits(t *testing.T) {
	committed := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	it, err := messageItem([]byte(`{"id": 7, "aggregate_id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8", "type": "order.placed", "payload": {}, "created_at": "2000-01-01T00:00:00Z"}`), committed, outbox.KafkaRouting{})
	require.NoError(t, err)
	require.NoError(t, it.err)
	require.Equal(t, int64(7), it.msg.ID)
	require.Equal(t, committed, it.msg.CreatedAt)
}
