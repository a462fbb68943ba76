package walrelay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/partition"
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

// Only partition.Name's names are the outbox's partitions: the move's
// twins and a revert's retired table are not, whatever their prefix.
func TestPartitionNames(t *testing.T) {
	require.True(t, isPartitionName(partition.Name("events_outbox", 0), "events_outbox"))
	require.True(t, isPartitionName(partition.Name("events_outbox", 300000), "events_outbox"))
	for _, name := range []string{"events_outbox", "events_outbox_partitioned", "events_outbox_plain", "events_outbox_retired", "events_outbox_p12", "other_p0000000000000000000"} {
		require.False(t, isPartitionName(name, "events_outbox"), name)
	}
}
