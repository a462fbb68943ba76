package outbox_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/contracts"
)

func orderContracts(t *testing.T) *contracts.Set {
	t.Helper()
	dir := t.TempDir()
	write := func(p, body string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644))
	}
	write("order.placed/v1.schema.json", `{"type":"object","required":["total"],"properties":{"total":{"type":"number"}}}`)
	write("order.placed/v2.schema.json", `{"type":"object","required":["total_cents"],"properties":{"total_cents":{"type":"integer"}},"additionalProperties":false}`)
	set, err := contracts.Load(dir)
	require.NoError(t, err)
	return set
}

// A payload that breaks its contract is refused before any SQL runs, with
// the pointer and the rule, and the transaction stays usable; one that
// keeps it is written with the version it was checked against.
func TestEmitChecksContracts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{Contracts: orderContracts(t)})
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	agg := uuid.New()

	// The Python producer's {"total": ...} against the latest version.
	_, err = p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]any{"total": 19.99}})
	require.ErrorIs(t, err, outbox.ErrContractViolation)
	var viol *contracts.Violation
	require.ErrorAs(t, err, &viol)
	require.Equal(t, 2, viol.Version)
	require.Equal(t, "/required", viol.Rule)
	require.Contains(t, err.Error(), "total_cents")

	_, err = p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]any{"total_cents": 1.5}})
	require.ErrorAs(t, err, &viol)
	require.Equal(t, "/total_cents", viol.Pointer)
	require.Equal(t, "/properties/total_cents/type", viol.Rule)

	_, err = p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Version: 7, Payload: map[string]any{}})
	require.ErrorIs(t, err, outbox.ErrContractViolation)
	require.ErrorIs(t, err, contracts.ErrUnknownVersion)

	_, err = p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]any{"total_cents": 1},
		Headers: map[string]string{outbox.HeaderEventVersion: "2"}})
	require.ErrorIs(t, err, outbox.ErrInvalidHeaders)

	// Nothing was sent: the transaction is still usable.
	v2, err := p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]any{"total_cents": 1999}})
	require.NoError(t, err)
	v1, err := p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Version: 1, Payload: map[string]any{"total": 19.99}})
	require.NoError(t, err)
	free, err := p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.shipped", Payload: map[string]any{"anything": true}})
	require.NoError(t, err, "a type without a contract is not checked")
	require.NoError(t, tx.Commit(ctx))

	for id, want := range map[int64]string{v2: "2", v1: "1", free: ""} {
		var got *string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT headers->>'event_version' FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).Scan(&got))
		if want == "" {
			require.Nil(t, got, "event %d", id)
			continue
		}
		require.NotNil(t, got, "event %d", id)
		require.Equal(t, want, *got, "event %d", id)
	}
}

// Without contracts, Event.Version still travels as the header.
func TestEmitVersionWithoutContracts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Version: 3, Payload: map[string]any{}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	var got string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT headers->>'event_version' FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).Scan(&got))
	require.Equal(t, "3", got)
}
