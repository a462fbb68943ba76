package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
)

// `go run ./examples/orders` against the tests' database: what it prints,
// and that it leaves no schema behind.
func TestRunPrintsWhatHappened(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.NoError(t, pgtest.EnsureDatabase(ctx))
	var out bytes.Buffer
	require.NoError(t, run(ctx, &out, pgtest.URL()), out.String())
	require.Equal(t, `order 1 placed for alice: 12.50, event 1 in the outbox
order 2 placed for bob: 30.00, event 2 in the outbox
order 3 placed for alice: 7.99, event 3 in the outbox
order 1 placed again: rolled back (duplicate order id), no event; 3 events in the outbox
relayed 3 events to topic "order"; the loyalty service processed 3
loyalty points: alice 19, bob 30 (one point per whole 100 cents of each order)
`, out.String())

	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'orders\\_example\\_%'").Scan(&left))
	require.Zero(t, left, "the example dropped its schema")
}
