package webhookpub

import "time"

// RetryAfter exposes retryAfter to the tests.
func RetryAfter(v string, now time.Time) time.Duration { return retryAfter(v, now) }
