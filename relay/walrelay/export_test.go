package walrelay

// NoKeepaliveAdvance makes r acknowledge only commits and heartbeats, not
// the WAL end of the server's keepalives, so a test can show that the
// heartbeat alone moves the slot.
func NoKeepaliveAdvance(r *Relayer) { r.keepaliveAdvance = false }
