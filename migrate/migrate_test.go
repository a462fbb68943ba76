package migrate_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

func tableExists(t *testing.T, db *pgtest.DB, qualified string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", qualified).Scan(&ok))
	return ok
}

func TestUpIsIdempotentAndStatusReportsVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)

	st, err := m.Status(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, 0, st.Current)
	require.False(t, st.UpToDate())
	require.ErrorContains(t, m.Validate(ctx, db.Pool), "run `outbox migrate up`")

	applied, err := m.Up(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, applied, m.Latest())
	require.True(t, tableExists(t, db, db.Tables.OutboxIdent()))
	require.True(t, tableExists(t, db, db.Tables.ProcessedIdent()))

	again, err := m.Up(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, again, "second run must be a no-op")

	st, err = m.Status(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, m.Latest(), st.Current)
	require.True(t, st.UpToDate())
	require.Len(t, st.Applied, m.Latest())
	require.NoError(t, m.Validate(ctx, db.Pool))

	// The pending indexes exist with the predicates the relayer relies on.
	var defs []string
	rows, err := db.Pool.Query(ctx, "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = 'events_outbox' ORDER BY indexname", db.Tables.Schema)
	require.NoError(t, err)
	for rows.Next() {
		var d string
		require.NoError(t, rows.Scan(&d))
		defs = append(defs, d)
	}
	require.NoError(t, rows.Err())
	// Only the primary key and the pending index: every index is paid for
	// by every Emit (migration 3 dropped the per-aggregate one).
	require.Equal(t, []string{
		`CREATE INDEX events_outbox_pending_idx ON ` + db.Tables.Schema + `.events_outbox USING btree (id) WHERE (dispatched_at IS NULL)`,
		`CREATE UNIQUE INDEX events_outbox_pkey ON ` + db.Tables.Schema + `.events_outbox USING btree (id)`,
	}, defs)
}

func TestConcurrentUpRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	var wg sync.WaitGroup
	total := make(chan int, 4)
	for range 4 {
		wg.Go(func() {
			applied, err := m.Up(ctx, db.Pool)
			if err != nil {
				t.Error(err)
			}
			total <- len(applied)
		})
	}
	wg.Wait()
	close(total)
	sum := 0
	for n := range total {
		sum += n
	}
	require.Equal(t, m.Latest(), sum, "each version applied exactly once")
}

func TestDownRevertsAndUpRestores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	reverted, err := m.Down(ctx, db.Pool, 0)
	require.NoError(t, err)
	require.Len(t, reverted, m.Latest())
	require.False(t, tableExists(t, db, db.Tables.OutboxIdent()))
	st, err := m.Status(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, 0, st.Current)
	_, err = m.Down(ctx, db.Pool, m.Latest()+1)
	require.ErrorContains(t, err, "out of range")
	_, err = m.Up(ctx, db.Pool)
	require.NoError(t, err)
	require.True(t, tableExists(t, db, db.Tables.OutboxIdent()))
}

func TestCustomNamesAndSeveralOutboxesInOneSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	a := outbox.Tables{Schema: db.Tables.Schema, Outbox: "billing_outbox", Processed: "billing_processed"}
	b := outbox.Tables{Schema: db.Tables.Schema, Outbox: "shipping_outbox", Processed: "shipping_processed"}
	for _, tb := range []outbox.Tables{a, b} {
		m, err := migrate.New(tb)
		require.NoError(t, err)
		_, err = m.Up(ctx, db.Pool)
		require.NoError(t, err)
		require.True(t, tableExists(t, db, tb.OutboxIdent()))
		require.True(t, tableExists(t, db, tb.ProcessedIdent()))
	}
	require.NotEqual(t, a.Channel(), b.Channel())
	require.NotEqual(t, a.LockNamespace(), b.LockNamespace())
}

func TestNewRejectsBadIdentifiers(t *testing.T) {
	t.Parallel()
	for _, tb := range []outbox.Tables{
		{Schema: "Public"},
		{Outbox: `events"; DROP TABLE x; --`},
		{Processed: "1abc"},
		{Outbox: "a_name_that_is_far_too_long_to_leave_room_for_its_index_names_x"},
	} {
		_, err := migrate.New(tb)
		require.Error(t, err, "%+v", tb)
		require.Contains(t, err.Error(), "name")
	}
}

func TestNewerSchemaIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO "`+db.Tables.Schema+`"."events_outbox_migrations" (version) VALUES ($1)`, m.Latest()+1)
	require.NoError(t, err)
	_, err = m.Up(ctx, db.Pool)
	require.ErrorIs(t, err, migrate.ErrNewerSchema)
	require.ErrorIs(t, m.Validate(ctx, db.Pool), migrate.ErrNewerSchema)
}
