// Package backoff holds the retry timing shared by the relayer, the
// consumer and the cleanup job: capped exponential backoff with jitter, and
// a sleep that ends early when its context does.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Delay returns the wait before retry number attempt (1-based): lo doubled
// per attempt, capped at hi, then jittered into [d/2, d] so replicas that
// failed together do not retry together.
func Delay(lo, hi time.Duration, attempt int) time.Duration {
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d/2 + rand.N(d/2+1)
}

// Sleep waits for d, or until ctx is done; it reports whether the full
// wait elapsed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
