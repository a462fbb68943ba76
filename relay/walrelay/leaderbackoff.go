package walrelay

import (
	"time"

	"github.com/pgoutbox/outbox/internal/backoff"
)

// leaderBackoff is Run's wait between tries to lead after a failure:
// BackoffMin doubling to BackoffMax, with jitter, over the failures since
// the last success. A success is a lead whose stream made progress (the
// slot's position moved: the database and the broker worked), or a try
// that found the database up and another relayer leading. Without the
// reset, failures added up across outages, and a relayer back from a
// short one waited for BackoffMax. A lead that fails before any progress
// (a crash loop: a setup error, a stream that fails at once) is no
// success, so it stays backed off.
type leaderBackoff struct {
	min, max time.Duration
	failures int
}

// standby records a try that found another relayer leading.
func (b *leaderBackoff) standby() { b.failures = 0 }

// led records the end of a lead: progressed if the slot's position
// moved meanwhile.
func (b *leaderBackoff) led(progressed bool) {
	if progressed {
		b.failures = 0
	}
}

// failed counts a failure and returns its attempt number and the wait
// before the next try.
func (b *leaderBackoff) failed() (int, time.Duration) {
	b.failures++
	return b.failures, backoff.Delay(b.min, b.max, b.failures)
}
