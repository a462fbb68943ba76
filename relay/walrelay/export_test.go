package walrelay

import "time"

// NoKeepaliveAdvance makes r acknowledge only commits and heartbeats, not
// the WAL end of the server's keepalives, so a test can show that the
// heartbeat alone moves the slot.
func NoKeepaliveAdvance(r *Relayer) { r.keepaliveAdvance = false }

// SetInlineBound sets how long r publishes a small batch on its stream
// goroutine before it hands the rest to its publisher goroutine.
func SetInlineBound(r *Relayer, d time.Duration) { r.inlineBound = d }
