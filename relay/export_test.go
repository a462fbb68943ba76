package relay

import "github.com/pgoutbox/outbox"

// ClaimSQL is the claim statement the relayer runs against tables, so plan
// tests can EXPLAIN exactly what runs in production.
func ClaimSQL(t outbox.Tables) string {
	return render(claimSQL, t.WithDefaults())
}

// ClaimBegin opens a transaction the way the relayer opens its claims'.
const ClaimBegin = claimBegin
