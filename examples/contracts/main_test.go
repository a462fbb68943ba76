package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/contracts"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// `go run ./examples/contracts` against the tests' database: what it
// prints, and that it leaves no schema behind.
func TestRunPrintsWhatHappened(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.NoError(t, pgtest.EnsureDatabase(ctx))
	var out bytes.Buffer
	require.NoError(t, run(ctx, &out, pgtest.URL()), out.String())
	require.Equal(t, `before the migration: order A emitted as v1 (event 1)
during the migration: order B emitted as v1 and v2 (events 2 and 3, event_versions "1,2")
order C refused: v2 breaks its contract at /total_cents (/properties/total_cents/type), so neither version was written
relayed 3 rows to topic "order"; each consumer settled all 3
billing-v1: order A, total 12.50 (from event 1, v1)
billing-v1: order B, total 30.00 (from event 2, v1)
billing-v2: order A, 1250 cents EUR (from event 1, v1, upcast)
billing-v2: order B, 3000 cents EUR (from event 3, v2)
`, out.String())

	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'contracts\\_example\\_%'").Scan(&left))
	require.Zero(t, left, "the example dropped its schema")
}

// The upcaster writes what the v2 contract accepts, cents rounded, not
// truncated, and refuses what is not v1.
func TestUpcastOrderPlacedV1(t *testing.T) {
	t.Parallel()
	set, err := contracts.Load("contracts")
	require.NoError(t, err)
	id := uuid.New()
	for total, cents := range map[float64]int64{0: 0, 12.5: 1250, 19.99: 1999, 0.29: 29, 1e6: 1e8} {
		v1, err := json.Marshal(OrderPlacedV1{OrderID: id, Total: total})
		require.NoError(t, err)
		_, err = set.Check("order.placed", 1, v1)
		require.NoError(t, err)
		v2, err := UpcastOrderPlacedV1(v1)
		require.NoError(t, err)
		_, err = set.Check("order.placed", 2, v2)
		require.NoError(t, err, string(v2))
		var got OrderPlacedV2
		require.NoError(t, json.Unmarshal(v2, &got))
		require.Equal(t, OrderPlacedV2{OrderID: id, TotalCents: cents, Currency: "EUR"}, got)
	}
	_, err = UpcastOrderPlacedV1(json.RawMessage(`{"order_id": "x", "total": "12"}`))
	require.ErrorContains(t, err, "decode v1")
}
