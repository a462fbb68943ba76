package relay

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every fragment binaryClaim rewrites is in claimSQL: a change to the
// claim that drops one fails here, not as a binary payload sized or
// returned wrong.
func TestBinaryClaimRewrite(t *testing.T) {
	t.Parallel()
	for _, r := range binaryClaimRewrites {
		require.Contains(t, claimSQL, r[0])
		require.Contains(t, claimBinarySQL, r[1])
	}
	require.NotContains(t, strings.ReplaceAll(claimBinarySQL, "payload_bytes", ""), "octet_length(payload::text) +")
	require.Contains(t, claimBinarySQL, "RETURNING id, aggregate_id, type, payload, headers, payload_bytes, content_type,")
	require.Contains(t, claimBinarySQL, "c.locked, m.payload_bytes, m.content_type\nFROM")
}

// Every fragment lanesClaim rewrites is in each claim it rewrites, and the
// rewrite reads the lanes table once, in held: a change to the claim that
// drops the fragment fails here, not as an aggregate overtaken in Kafka.
func TestLanesClaimRewrite(t *testing.T) {
	t.Parallel()
	for _, sql := range []string{claimSQL, claimBinarySQL, claimPartitionedSQL, claimBinaryPartitionedSQL} {
		for _, r := range lanesClaimRewrites {
			require.Contains(t, sql, r[0])
		}
	}
	for _, sql := range []string{claimLanesSQL, claimBinaryLanesSQL, claimPartitionedLanesSQL, claimBinaryPartitionedLanesSQL} {
		require.Equal(t, 1, strings.Count(sql, "{{lanes}}"))
		require.Contains(t, sql, "WHERE l.lane <> $4::integer")
	}
}
