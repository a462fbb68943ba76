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
