package ops

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// binaryShow rewrites all three reads of the payload in both show
// statements, and adds the content type.
func TestBinaryShowRewrite(t *testing.T) {
	t.Parallel()
	for _, sql := range []string{showBinarySQL, showParkedBinarySQL} {
		require.Equal(t, 2, strings.Count(sql, "payload_bytes IS NOT NULL")+strings.Count(sql, "octet_length(o.payload_bytes)")+strings.Count(sql, "octet_length(payload_bytes)"), sql)
		require.Contains(t, sql, "content_type\nFROM", sql)
		require.Contains(t, sql, `'\x' || encode(`, sql)
	}
}
