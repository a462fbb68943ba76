package walrelay_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// Only what the producers' role commits becomes an event. A role with no
// grants writes logical messages with the outbox's prefix carrying the
// ids the next real events will draw: non-transactional, non-transactional
// in a transaction it rolls back, transactional in one it rolls back, and
// transactional committed while the relay's message-mode events are off.
// None is published; the real events with those ids are, each once. With
// message-mode events on, the relay refuses to start while PUBLIC (or any
// role but the relay's and superusers) can write messages, saying
// what to run, also while a role that may insert into the outbox can:
// once they are revoked, the role is refused by Postgres and the relay
// publishes message-mode events.
func TestForgedMessagesAreNeverPublished(t *testing.T) {
	t.Parallel()
	c := privateLogical(t)
	b := setupOn(t, c.URL())
	ctx := context.Background()
	prefix := walrelay.MessagePrefix(b.db.Tables)

	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	role := "forger_" + hex.EncodeToString(rnd[:])
	_, err := b.db.Pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	cc, err := pgx.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cc.User = role
	forger, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = forger.Close(context.Background())
		_, _ = b.db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})

	r := b.relayer(t, func(cfg *walrelay.Config) { cfg.Messages = false })
	stop := run(t, r)
	waitLeading(t, r)

	const next = 30000
	_, err = b.db.Pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence($1, 'id'), $2)`, b.db.Tables.OutboxIdent(), next)
	require.NoError(t, err)
	agg := uuid.New()
	forged := func(id int) string {
		return fmt.Sprintf(`{"id": %d, "aggregate_id": "%s", "type": "order.refunded", "payload": {"forged": true}}`, id, agg)
	}
	emit := `SELECT pg_logical_emit_message($1, $2, $3::text)`
	_, err = forger.Exec(ctx, emit, false, prefix, forged(next+1))
	require.NoError(t, err, "PUBLIC can execute pg_logical_emit_message by default")
	for i, transactional := range []bool{false, true} {
		tx, err := forger.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, emit, transactional, prefix, forged(next+2+i))
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
	}
	_, err = forger.Exec(ctx, emit, true, prefix, forged(next+4))
	require.NoError(t, err)

	var want []int64
	for range 4 {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			id, err := b.producer.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]bool{"real": true}})
			want = append(want, id)
			return err
		}))
	}
	require.Equal(t, []int64{next + 1, next + 2, next + 3, next + 4}, want, "the real events drew the forged ids")
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeastThenQuiet(len(want), time.Second), "order")
	var got []int64
	for _, rec := range recs {
		got = append(got, kafkatest.EventID(rec))
		require.Equal(t, "order.placed", kafkatest.Headers(rec)[outbox.HeaderEventType], "event %d", kafkatest.EventID(rec))
		require.JSONEq(t, `{"real": true}`, string(rec.Value))
	}
	require.Equal(t, want, got, "the real events, each once; no forged one")
	// The two non-transactional ones and the committed one were read and
	// dropped; the rolled-back transactional one was never decoded.
	require.Equal(t, int64(3), r.Stats().Dropped)

	// Message-mode events on: refused while PUBLIC can write messages.
	runOnce := func() error {
		r := b.relayer(t, nil)
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return r.Run(rctx)
	}
	err = runOnce()
	require.ErrorIs(t, err, walrelay.ErrMessagesOpen)
	require.ErrorContains(t, err, "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean,text,bytea), pg_catalog.pg_logical_emit_message(boolean,text,text) FROM PUBLIC")

	stmts, err := walrelay.SecureMessages(ctx, b.db.Pool)
	require.NoError(t, err)
	require.Len(t, stmts, 2)
	_, err = forger.Exec(ctx, emit, true, prefix, forged(next+5))
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "42501", pgErr.Code, "permission denied: %v", err)

	// A role granted the function could still forge, INSERT on the outbox
	// or not: refused, by name, until it is revoked again.
	grant, err := walrelay.GrantMessagesSQL(ctx, b.db.Pool, role)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, grant)
	require.NoError(t, err)
	err = runOnce()
	require.ErrorIs(t, err, walrelay.ErrMessagesOpen)
	require.ErrorContains(t, err, `role(s) "`+role+`" can execute pg_logical_emit_message`)
	_, err = b.db.Pool.Exec(ctx, "GRANT INSERT ON "+b.db.Tables.OutboxIdent()+" TO "+role)
	require.NoError(t, err)
	err = runOnce()
	require.ErrorIs(t, err, walrelay.ErrMessagesOpen, "INSERT on the outbox does not let a role choose ids")
	require.ErrorContains(t, err, `role(s) "`+role+`" can execute pg_logical_emit_message`)
	_, err = b.db.Pool.Exec(ctx, "REVOKE EXECUTE ON FUNCTION "+emitMessageFuncs+" FROM "+role)
	require.NoError(t, err)

	// Secured, the relay with message-mode events on publishes them.
	stop()
	r = b.relayer(t, nil)
	run(t, r)
	waitLeading(t, r)
	p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables, Mode: outbox.ModeMessage})
	require.NoError(t, err)
	var id int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		id, err = p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]bool{"real": true}})
		return err
	}))
	recs = kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeast(len(want)+1), "order")
	require.Equal(t, id, kafkatest.EventID(recs[len(recs)-1]))
}

// emitMessageFuncs are pg_logical_emit_message's overloads on PG 15.
const emitMessageFuncs = "pg_catalog.pg_logical_emit_message(boolean,text,bytea), pg_catalog.pg_logical_emit_message(boolean,text,text)"

// runOnce runs a relayer with message-mode events on until it stops, or
// for 10 seconds.
func runOnce(t *testing.T, b *bundle) error {
	t.Helper()
	r := b.relayer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.Run(ctx)
}

// Ids belong to the outbox, whichever the mode. A role that may insert
// into the outbox and write logical messages writes one with the outbox's
// prefix carrying a real event's id: consumers would skip the real event
// as a duplicate. The relay with message-mode events on refuses to start,
// naming the role and saying what to run. Once that is run, the role is
// refused by Postgres, and a producer granted only <outbox>_emit_message
// writes events whose ids the outbox drew from its sequence, published
// under those ids; it cannot write a message, or a row, of its own.
func TestMessageModeIDsAreDrawnNotChosen(t *testing.T) {
	t.Parallel()
	c := privateLogical(t)
	b := setupOn(t, c.URL())
	ctx := context.Background()
	_, err := walrelay.SecureMessages(ctx, b.db.Pool)
	require.NoError(t, err)
	tbl := b.db.Tables.OutboxIdent()
	fn := walrelay.EmitMessageFunc(b.db.Tables)
	usage := "GRANT USAGE ON SCHEMA " + pgident.Quote(b.db.Tables.Schema) + " TO {{role}}"
	forgerName, forger := b.db.Role(t, usage, "GRANT INSERT ON "+tbl+" TO {{role}}", "GRANT EXECUTE ON FUNCTION "+emitMessageFuncs+" TO {{role}}")

	r := b.relayer(t, func(cfg *walrelay.Config) { cfg.Messages = false })
	stop := run(t, r)
	waitLeading(t, r)
	agg := uuid.New()
	var real int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		real, err = b.producer.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.placed", Payload: map[string]bool{"real": true}})
		return err
	}))
	emit := `SELECT pg_logical_emit_message(true, $1, $2::text)`
	forged := fmt.Sprintf(`{"id": %d, "aggregate_id": "%s", "type": "order.refunded", "payload": {"forged": true}, "created_at": "2000-01-01T00:00:00Z"}`, real, agg)
	_, err = forger.Exec(ctx, emit, walrelay.MessagePrefix(b.db.Tables), forged)
	require.NoError(t, err, "granted, the forger writes messages")
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeast(1), "order")
	require.Equal(t, real, kafkatest.EventID(recs[0]))
	// Message-mode events off, the forged one was dropped; let the slot
	// confirm it, so that the next relayer does not read it again.
	var lsn string
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn))
	require.Eventually(t, func() bool {
		var done bool
		err := b.db.Pool.QueryRow(ctx, "SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", b.slot, lsn).Scan(&done)
		return err == nil && done
	}, 20*time.Second, 50*time.Millisecond, "the slot never confirmed the forged message")
	require.Equal(t, int64(1), r.Stats().Dropped)
	stop()

	err = runOnce(t, b)
	require.ErrorIs(t, err, walrelay.ErrMessagesOpen)
	require.ErrorContains(t, err, `role(s) "`+forgerName+`" can execute pg_logical_emit_message`)
	revoke := "REVOKE EXECUTE ON FUNCTION " + emitMessageFuncs + ` FROM "` + forgerName + `";`
	require.ErrorContains(t, err, revoke)
	require.ErrorContains(t, err, "GRANT EXECUTE ON FUNCTION "+fn+` TO "`+forgerName+`"`)
	_, err = b.db.Pool.Exec(ctx, revoke)
	require.NoError(t, err)
	_, err = forger.Exec(ctx, emit, walrelay.MessagePrefix(b.db.Tables), forged)
	requireCode(t, "42501", err)

	_, producer := b.db.Role(t, usage, "GRANT EXECUTE ON FUNCTION "+fn+" TO {{role}}")
	r = b.relayer(t, nil)
	run(t, r)
	waitLeading(t, r)
	p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables, Mode: outbox.ModeMessage})
	require.NoError(t, err)
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, producer, func(tx pgx.Tx) error {
		id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: agg, Type: "order.shipped", Payload: map[string]int{"n": 1}})
		if err != nil {
			return err
		}
		batch, err := p.EmitBatch(ctx, tx, []outbox.Event{
			{AggregateID: agg, Type: "order.shipped", Payload: map[string]int{"n": 2}},
			{AggregateID: agg, Type: "order.shipped", Payload: map[string]int{"n": 3}},
		})
		ids = append(append(ids, id), batch...)
		return err
	}))
	require.Equal(t, []int64{real + 1, real + 2, real + 3}, ids, "the ids the outbox's sequence drew next")
	var last int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT last_value FROM "+pgident.Qualified(b.db.Tables.Schema, b.db.Tables.Outbox+"_id_seq")).Scan(&last))
	require.Equal(t, real+3, last)
	recs = kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeastThenQuiet(4, time.Second), "order")
	var got []int64
	for _, rec := range recs {
		got = append(got, kafkatest.EventID(rec))
	}
	require.Equal(t, append([]int64{real}, ids...), got, "the real event once, then the producer's under the drawn ids")
	require.JSONEq(t, `{"n": 3}`, string(recs[3].Value))

	// The producer can write neither a message nor a row of its own.
	_, err = producer.Exec(ctx, emit, walrelay.MessagePrefix(b.db.Tables), forged)
	requireCode(t, "42501", err)
	_, err = producer.Exec(ctx, "INSERT INTO "+tbl+" (id, aggregate_id, type, payload) VALUES ($1, $2, 'order.placed', '{}')", real+100, agg)
	requireCode(t, "42501", err)
}

// Every role that can execute pg_logical_emit_message counts, login or
// not: a NOINHERIT login role cannot execute it itself, but can SET ROLE
// to a NOLOGIN role it is a member of that can, and write events there.
func TestMessagesCheckCountsRolesThatCannotLogIn(t *testing.T) {
	t.Parallel()
	c := privateLogical(t)
	b := setupOn(t, c.URL())
	ctx := context.Background()
	_, err := walrelay.SecureMessages(ctx, b.db.Pool)
	require.NoError(t, err)
	require.NoError(t, walrelay.CheckMessages(ctx, b.db.Pool, b.db.Tables), "secured, with no other role granted")

	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	group := "emitters_" + hex.EncodeToString(rnd[:])
	_, err = b.db.Pool.Exec(ctx, "CREATE ROLE "+group+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.db.Pool.Exec(context.Background(), "DROP OWNED BY "+group)
		_, _ = b.db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+group)
	})
	_, err = b.db.Pool.Exec(ctx, "GRANT EXECUTE ON FUNCTION "+emitMessageFuncs+" TO "+group)
	require.NoError(t, err)
	_, member := b.db.Role(t, "ALTER ROLE {{role}} NOINHERIT", "GRANT "+group+" TO {{role}}")

	conn, err := member.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	emit := `SELECT pg_logical_emit_message(true, $1, '{}'::text)`
	_, err = conn.Exec(ctx, emit, walrelay.MessagePrefix(b.db.Tables))
	requireCode(t, "42501", err)
	_, err = conn.Exec(ctx, "SET ROLE "+group)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, emit, walrelay.MessagePrefix(b.db.Tables))
	require.NoError(t, err, "as the group, the member writes messages")
	_, err = conn.Exec(ctx, "RESET ROLE")
	require.NoError(t, err)

	err = walrelay.CheckMessages(ctx, b.db.Pool, b.db.Tables)
	require.ErrorIs(t, err, walrelay.ErrMessagesOpen)
	require.ErrorContains(t, err, `role(s) "`+group+`" can execute pg_logical_emit_message`)
}

func requireCode(t *testing.T, code string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got %v", code, err)
	require.Equal(t, code, pgErr.Code, "%v", err)
}
