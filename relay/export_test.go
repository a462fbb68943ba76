package relay

import (
	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// ClaimSQL is the claim statement the relayer runs against tables, so plan
// tests can EXPLAIN exactly what runs in production.
func ClaimSQL(t outbox.Tables) string {
	return render(claimSQL, t.WithDefaults())
}

// ClaimBegin opens a transaction the way the relayer opens its claims'.
const ClaimBegin = claimBegin

// ClaimLanesSQL is the exactly-once relayer's claim (Common.ExactlyOnce):
// claimSQL that also skips the aggregates of other lanes' reservations.
func ClaimLanesSQL(t outbox.Tables) string {
	return render(claimLanesSQL, t.WithDefaults())
}

// LanesIdent is the lanes table of t's outbox (migration 8).
func LanesIdent(t outbox.Tables) string {
	t = t.WithDefaults()
	return sqltext.For(t.Schema, t.Outbox, t.Processed).Lanes
}
