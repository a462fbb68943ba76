package backoff_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/backoff"
)

func TestDelayDoublesCapsAndJitters(t *testing.T) {
	t.Parallel()
	lo, hi := 100*time.Millisecond, time.Second
	for attempt, want := range map[int]time.Duration{1: lo, 2: 2 * lo, 3: 4 * lo, 4: 8 * lo, 5: hi, 50: hi} {
		for range 100 {
			d := backoff.Delay(lo, hi, attempt)
			require.GreaterOrEqual(t, d, want/2, "attempt %d", attempt)
			require.LessOrEqual(t, d, want, "attempt %d", attempt)
		}
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	t.Parallel()
	require.True(t, backoff.Sleep(context.Background(), time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	require.False(t, backoff.Sleep(ctx, time.Hour))
	require.Less(t, time.Since(start), time.Second)
}
