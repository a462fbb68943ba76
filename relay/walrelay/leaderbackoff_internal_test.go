package walrelay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The backoff between tries to lead grows over failures in a row and
// starts over after a success: a lead that made progress, or a try that
// found another relayer leading; a lead that failed without progress
// does not reset it.
func TestLeaderBackoffResetsAfterASuccess(t *testing.T) {
	t.Parallel()
	b := &leaderBackoff{min: 100 * time.Millisecond, max: 30 * time.Second}
	var d time.Duration
	for range 10 {
		_, d = b.failed()
	}
	require.GreaterOrEqual(t, d, 15*time.Second, "ten failures in a row: near BackoffMax")

	b.led(false) // led, failed at once: a crash loop stays backed off
	attempt, d := b.failed()
	require.Equal(t, 11, attempt)
	require.GreaterOrEqual(t, d, 15*time.Second)

	b.led(true) // streamed and moved the slot
	attempt, d = b.failed()
	require.Equal(t, 1, attempt)
	require.LessOrEqual(t, d, 100*time.Millisecond)

	for range 10 {
		b.failed()
	}
	b.standby() // the database answered; another relayer leads
	attempt, d = b.failed()
	require.Equal(t, 1, attempt)
	require.LessOrEqual(t, d, 100*time.Millisecond)
}
