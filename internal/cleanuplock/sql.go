package cleanuplock

import "github.com/pgoutbox/outbox/internal/sqltext"

// lockSQL and unlockSQL take and release the cleanup's session lock
// (internal/lockkey.Cleanup); $1 namespace, $2 id.
const (
	lockSQL   = `SELECT pg_try_advisory_lock($1::int4, $2::int4)`
	unlockSQL = `SELECT pg_advisory_unlock($1::int4, $2::int4)`
)

var _ = sqltext.Register("cleanuplock", map[string]string{"lockSQL": lockSQL, "unlockSQL": unlockSQL})
