package outbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/contracts"
)

// A dual emit writes one row per version, consecutive in one statement,
// each with its own event_version, the shared event_versions list and the
// caller's headers; each payload is checked against its own version.
func TestEmitVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{Contracts: orderContracts(t)})
	agg := uuid.New()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	ids, err := p.EmitVersions(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Headers: map[string]string{"tenant": "acme"}},
		outbox.VersionedPayload{Version: 1, Payload: map[string]any{"total": 19.99}},
		outbox.VersionedPayload{Version: 2, Payload: map[string]any{"total_cents": 1999}},
	)
	require.NoError(t, err)
	require.Len(t, ids, 2)
	require.Equal(t, ids[0]+1, ids[1], "one statement, one session: consecutive ids")
	require.NoError(t, tx.Commit(ctx))

	rows, err := db.Pool.Query(ctx, "SELECT aggregate_id, type, payload::text, headers->>'event_version', headers->>'event_versions', headers->>'tenant' FROM "+db.Tables.OutboxIdent()+" ORDER BY id")
	require.NoError(t, err)
	type row struct {
		Agg                                  uuid.UUID
		Type, Payload, Ver, Versions, Tenant string
	}
	var got []row
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.Agg, &r.Type, &r.Payload, &r.Ver, &r.Versions, &r.Tenant))
		got = append(got, r)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []row{
		{agg, "order.placed", `{"total": 19.99}`, "1", "1,2", "acme"},
		{agg, "order.placed", `{"total_cents": 1999}`, "2", "1,2", "acme"},
	}, got)
}

// One version that breaks its contract refuses the whole set before any
// SQL: nothing is written and the transaction stays usable. Malformed
// sets say what to do.
func TestEmitVersionsRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{Contracts: orderContracts(t)})
	agg := uuid.New()
	ev := outbox.Event{AggregateID: agg, Type: "order.placed"}
	v1 := outbox.VersionedPayload{Version: 1, Payload: map[string]any{"total": 19.99}}
	v2 := outbox.VersionedPayload{Version: 2, Payload: map[string]any{"total_cents": 1999}}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()

	_, err = p.EmitVersions(ctx, tx, ev, v1, outbox.VersionedPayload{Version: 2, Payload: map[string]any{"total_cents": 19.99}})
	require.ErrorIs(t, err, outbox.ErrContractViolation)
	var viol *contracts.Violation
	require.ErrorAs(t, err, &viol)
	require.Equal(t, 2, viol.Version)
	require.Equal(t, "/total_cents", viol.Pointer)
	require.Contains(t, err.Error(), "version 2 of 1,2")

	for name, tc := range map[string]struct {
		ev       outbox.Event
		versions []outbox.VersionedPayload
		is       error
		says     string
	}{
		"none":            {ev, nil, outbox.ErrEmptyBatch, "no versions"},
		"payload set":     {outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]any{}}, []outbox.VersionedPayload{v1, v2}, outbox.ErrInvalidPayload, "leave Event.Payload and Event.Version zero"},
		"version set":     {outbox.Event{AggregateID: agg, Type: "order.placed", Version: 2}, []outbox.VersionedPayload{v1, v2}, outbox.ErrInvalidPayload, "leave Event.Payload and Event.Version zero"},
		"descending":      {ev, []outbox.VersionedPayload{v2, v1}, outbox.ErrContractViolation, "ascending order"},
		"twice":           {ev, []outbox.VersionedPayload{v1, v1}, outbox.ErrContractViolation, "each version once"},
		"zero":            {ev, []outbox.VersionedPayload{{Payload: map[string]any{}}, v2}, outbox.ErrContractViolation, "from 1"},
		"unknown version": {ev, []outbox.VersionedPayload{v1, v2, {Version: 3, Payload: map[string]any{}}}, contracts.ErrUnknownVersion, "version 3 of 1,2,3"},
		"user header":     {outbox.Event{AggregateID: agg, Type: "order.placed", Headers: map[string]string{outbox.HeaderEventVersions: "1,2"}}, []outbox.VersionedPayload{v1, v2}, outbox.ErrInvalidHeaders, "written by EmitVersions"},
		"nil aggregate":   {outbox.Event{Type: "order.placed"}, []outbox.VersionedPayload{v1, v2}, outbox.ErrNilAggregate, ""},
	} {
		_, err := p.EmitVersions(ctx, tx, tc.ev, tc.versions...)
		require.ErrorIs(t, err, tc.is, name)
		require.Contains(t, err.Error(), tc.says, name)
	}
	_, err = p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]any{"total_cents": 1},
		Headers: map[string]string{outbox.HeaderEventVersions: "2"}})
	require.ErrorIs(t, err, outbox.ErrInvalidHeaders, "Emit refuses the header too")

	// Nothing was sent: the transaction still works and holds only this.
	_, err = p.EmitVersions(ctx, tx, ev, v1, v2)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 2, countRows(t, db))
}

// The database/sql form writes the same rows.
func TestEmitVersionsSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	defer sdb.Close()
	tx, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids, err := p.EmitVersionsSQL(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed"},
		outbox.VersionedPayload{Version: 1, Payload: map[string]any{"total": 1.5}},
		outbox.VersionedPayload{Version: 3, Payload: map[string]any{"total_cents": 150, "currency": "EUR"}},
	)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	for i, want := range []string{"1", "3"} {
		var ver, list string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT headers->>'event_version', headers->>'event_versions' FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", ids[i]).Scan(&ver, &list))
		require.Equal(t, want, ver)
		require.Equal(t, "1,3", list)
	}
}

// In the WAL-only modes a dual emit takes the batch's path: no row is
// left, ids ascend with the versions.
func TestEmitVersionsWALOnlyModes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mode := range []outbox.Mode{outbox.ModeInsertDelete, outbox.ModeMessage} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db, p := setup(t, outbox.Config{Mode: mode})
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			ids, err := p.EmitVersions(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed"},
				outbox.VersionedPayload{Version: 1, Payload: map[string]any{"total": 1}},
				outbox.VersionedPayload{Version: 2, Payload: map[string]any{"total_cents": 100}},
			)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			require.Len(t, ids, 2)
			require.Greater(t, ids[1], ids[0])
			require.Zero(t, countRows(t, db))
		})
	}
}
