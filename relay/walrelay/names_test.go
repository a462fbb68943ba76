package walrelay_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// Default slot names are unique per database, schema and table: two long
// table names whose 63-byte cuts read the same, the same outbox in two
// databases (slot names are cluster-wide), and names that join to the
// same text all get names of their own, each a valid identifier.
func TestDefaultNamesAreUniquePerDatabaseSchemaAndTable(t *testing.T) {
	t.Parallel()
	billing := "tenant_billing_service_production"
	cases := [][2]struct {
		db string
		t  outbox.Tables
	}{
		{{"app", outbox.Tables{Schema: billing, Outbox: "events_outbox_invoices"}}, {"app", outbox.Tables{Schema: billing, Outbox: "events_outbox_invoices_v2"}}},
		{{"orders", outbox.Tables{}}, {"billing", outbox.Tables{}}},
		{{"a_b", outbox.Tables{Schema: "c", Outbox: "d"}}, {"a", outbox.Tables{Schema: "b_c", Outbox: "d"}}},
		{{"a", outbox.Tables{Schema: "b", Outbox: "c"}}, {"a_b", outbox.Tables{Outbox: "c"}}},
	}
	for _, c := range cases {
		n1, n2 := walrelay.DefaultName(c[0].db, c[0].t), walrelay.DefaultName(c[1].db, c[1].t)
		require.NotEqual(t, n1, n2, "%v and %v", c[0], c[1])
		for _, n := range []string{n1, n2} {
			require.NoError(t, pgident.Validate("slot", n))
		}
	}
	n := walrelay.DefaultName("My-App.db", outbox.Tables{})
	require.NoError(t, pgident.Validate("slot", n))
	require.Regexp(t, `^outbox_my_app_db_events_outbox_[0-9a-f]{8}$`, n)
	require.Equal(t, n, walrelay.DefaultName("My-App.db", outbox.Tables{}), "stable")
}

// A relay pointed at a publication of another outbox's table (as two
// outboxes sharing a default name were) refuses to start before it
// streams anything: the other outbox's slot is not confirmed, and its
// own relay then publishes every one of its events. One pointed at that
// publication with a slot of its own does not even create the slot.
func TestRelayRefusesAPublicationOfAnotherTable(t *testing.T) {
	t.Parallel()
	a := setup(t)
	other, otherSlot := logicalOutbox(t)
	ctx := context.Background()
	require.NoError(t, walrelay.Setup(ctx, other.Pool, other.Tables, otherSlot, otherSlot))
	var want []int64
	for range 40 {
		require.NoError(t, pgx.BeginFunc(ctx, other.Pool, func(tx pgx.Tx) error {
			p, err := outbox.NewProducer(outbox.Config{Tables: other.Tables})
			if err != nil {
				return err
			}
			id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"n": 1}})
			want = append(want, id)
			return err
		}))
	}
	confirmed := func(slot string) string {
		var lsn *string
		require.NoError(t, a.db.Pool.QueryRow(ctx, `SELECT (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&lsn))
		if lsn == nil {
			return "none"
		}
		return *lsn
	}
	before := confirmed(otherSlot)

	runRefused := func(slot string) error {
		r := a.relayer(t, func(cfg *walrelay.Config) { cfg.Slot, cfg.Publication = slot, otherSlot })
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		return r.Run(rctx)
	}
	err := runRefused(otherSlot)
	require.ErrorIs(t, err, walrelay.ErrNotThisOutbox)
	require.ErrorContains(t, err, "publication "+otherSlot+" publishes "+other.Tables.Schema+".events_outbox, not exactly "+a.db.Tables.OutboxIdent())
	require.Equal(t, before, confirmed(otherSlot), "nothing confirmed")

	own := "own_" + a.slot[len(a.slot)-8:]
	require.ErrorIs(t, runRefused(own), walrelay.ErrNotThisOutbox)
	require.Equal(t, "none", confirmed(own), "no slot created")

	r := a.relayer(t, func(cfg *walrelay.Config) { cfg.Pool, cfg.Tables = other.Pool, other.Tables })
	run(t, r)
	recs := kafkatest.Read(t, a.broker.Addr(), 30*time.Second, kafkatest.AtLeast(len(want)), "order")
	var got []int64
	for _, rec := range recs {
		got = append(got, kafkatest.EventID(rec))
	}
	require.ElementsMatch(t, want, got, "every event of the other outbox, published by its own relay")
}

// The same outbox (schema and table) in two databases of one server, both
// with default settings, gets two slots, and each relay publishes its
// database's events.
func TestSameOutboxInTwoDatabasesGetsTwoSlots(t *testing.T) {
	t.Parallel()
	a := setup(t)
	ctx := context.Background()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "wal_second_" + hex.EncodeToString(rnd[:])
	_, err := a.db.Pool.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	u, err := url.Parse(a.db.URL)
	require.NoError(t, err)
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	second := &bundle{db: &pgtest.DB{Pool: pool, Tables: a.db.Tables, URL: u.String()}, broker: a.broker, producer: a.producer}
	second.slot = walrelay.DefaultNameOf(pool, a.db.Tables)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil && walrelay.Teardown(ctx, pool, second.slot, second.slot) != nil {
			time.Sleep(100 * time.Millisecond)
		}
		pool.Close()
		_, _ = a.db.Pool.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	_, err = pool.Exec(ctx, "CREATE SCHEMA "+pgident.Quote(a.db.Tables.Schema))
	require.NoError(t, err)
	m, err := migrate.New(a.db.Tables)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)
	require.NotEqual(t, a.slot, second.slot)

	var want []int64
	for _, b := range []*bundle{a, second} {
		// Function privileges are per database: the new one's
		// pg_logical_emit_message is PUBLIC's.
		r := b.relayer(t, func(cfg *walrelay.Config) { cfg.Messages = false })
		run(t, r)
		waitLeading(t, r)
		require.Equal(t, b.slot, r.Config().Slot)
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			id, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]string{"db": b.db.URL}})
			want = append(want, id)
			return err
		}))
	}
	recs := kafkatest.Read(t, a.broker.Addr(), 30*time.Second, kafkatest.AtLeast(2), "order")
	require.Len(t, recs, 2)
}

// A relay upgraded in place, whose outbox's slot has the default name of
// earlier versions ("outbox_<schema>_<table>"), does not create a new
// slot under the new default (it would start at the current position and
// skip what is pending in the old one): left to its defaults it refuses,
// naming the old slot; Names resolves to it (as the CLI does), and the
// relay then publishes what was pending.
func TestUpgradedRelayKeepsTheSlotOfTheOldDefaultName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := "outbox_" + b.db.Tables.Schema + "_events_outbox"
	if len(old) > 63 {
		old = old[:63]
	}
	require.NoError(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, old, old))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil && walrelay.Teardown(ctx, b.db.Pool, old, old) != nil {
			time.Sleep(100 * time.Millisecond)
		}
	})
	ids := b.emitMany(t, aggregates(3), 5)

	r := b.relayer(t, nil)
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err := r.Run(rctx)
	cancel()
	require.ErrorIs(t, err, walrelay.ErrLegacySlot)
	require.ErrorContains(t, err, "--slot "+old+" --publication "+old)
	var exists bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, b.slot).Scan(&exists))
	require.False(t, exists, "no slot under the new default")

	slot, pub, legacy, err := walrelay.Names(ctx, b.db.Pool, b.db.Tables, "", "")
	require.NoError(t, err)
	require.True(t, legacy)
	require.Equal(t, [2]string{old, old}, [2]string{slot, pub})
	r = b.relayer(t, func(cfg *walrelay.Config) { cfg.Slot, cfg.Publication = slot, pub })
	run(t, r)
	recs := kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeast(len(ids)), "order")
	checkOrder(t, recs, ids)
}

// A publication of this outbox's table that streams only some of its rows
// (a WHERE clause) or columns (a column list) is not this outbox's: the
// rows it leaves out would never be read while the slot moved past them.
// The relay refuses it before it streams, so nothing is confirmed.
func TestRelayRefusesAFilteredPublicationOfItsTable(t *testing.T) {
	t.Parallel()
	a := setup(t)
	ctx := context.Background()
	var version int
	require.NoError(t, a.db.Pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version))
	if version < 150000 {
		t.Skip("row filters and column lists came with Postgres 15")
	}
	for name, spec := range map[string]string{
		"rows":    `WHERE (type <> 'order.refunded')`,
		"columns": `(id, aggregate_id, type, payload)`,
	} {
		t.Run(name, func(t *testing.T) {
			pub := "filtered_" + name + "_" + a.slot[len(a.slot)-8:]
			_, err := a.db.Pool.Exec(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+a.db.Tables.OutboxIdent()+" "+spec+" WITH (publish = 'insert')")
			require.NoError(t, err)
			t.Cleanup(func() { _ = walrelay.Teardown(context.Background(), a.db.Pool, pub, pub) })
			r := a.relayer(t, func(cfg *walrelay.Config) { cfg.Slot, cfg.Publication = pub, pub })
			rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			err = r.Run(rctx)
			require.ErrorIs(t, err, walrelay.ErrNotThisOutbox)
			require.ErrorContains(t, err, "publication "+pub+" publishes ")
			var slots int
			require.NoError(t, a.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, pub).Scan(&slots))
			require.Zero(t, slots, "no slot created, nothing confirmed")
		})
	}
}

// The publication of a partitioned outbox must report its partitions'
// inserts as the outbox's (publish_via_partition_root): Setup makes it so,
// fixes a publication without it while no slot was made (nothing was
// decoded yet), and refuses one with a slot, saying how to start again.
func TestSetupPublishesAPartitionedOutboxAsItself(t *testing.T) {
	t.Parallel()
	url := needLogical(t)
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4, ServerURL: url, Partitioned: true, PartitionWidth: 100})
	viaRoot := func(pub string) bool {
		var v bool
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pubviaroot FROM pg_publication WHERE pubname = $1", pub).Scan(&v))
		return v
	}
	suffix := strings.ReplaceAll(uuid.NewString(), "-", "")[:10]
	for _, name := range []string{"fresh", "byhand", "slotted"} {
		name := name + "_" + suffix
		t.Cleanup(func() { _ = walrelay.Teardown(context.Background(), db.Pool, name, name) })
	}
	fresh := "fresh_" + suffix
	require.NoError(t, walrelay.Setup(ctx, db.Pool, db.Tables, fresh, fresh))
	require.True(t, viaRoot(fresh))

	byHand := "byhand_" + suffix
	_, err := db.Pool.Exec(ctx, "CREATE PUBLICATION "+byHand+" FOR TABLE "+db.Tables.OutboxIdent()+" WITH (publish = 'insert')")
	require.NoError(t, err)
	require.NoError(t, walrelay.Setup(ctx, db.Pool, db.Tables, byHand, byHand))
	require.True(t, viaRoot(byHand), "fixed: no slot had decoded anything with it off")

	slotted := "slotted_" + suffix
	_, err = db.Pool.Exec(ctx, "CREATE PUBLICATION "+slotted+" FOR TABLE "+db.Tables.OutboxIdent()+" WITH (publish = 'insert')")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slotted)
	require.NoError(t, err)
	err = walrelay.Setup(ctx, db.Pool, db.Tables, slotted, slotted)
	require.ErrorIs(t, err, walrelay.ErrNotThisOutbox)
	require.ErrorContains(t, err, "publish_via_partition_root is off")
	require.False(t, viaRoot(slotted), "left as it was")
}
