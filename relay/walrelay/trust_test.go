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
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// Only what the producers' role commits becomes an event. A role with no
// grants writes logical messages with the outbox's prefix carrying the
// ids the next real events will draw: non-transactional, non-transactional
// in a transaction it rolls back, transactional in one it rolls back, and
// transactional committed while the relay's message-mode events are off.
// None is published; the real events with those ids are, each once. With
// message-mode events on, the relay refuses to start while PUBLIC (or a
// role that may not insert into the outbox) can write messages, saying
// what to run; once they are revoked, the role is refused by Postgres and
// the relay publishes message-mode events.
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

	// A role granted the function without being a producer (no INSERT on
	// the outbox) could still forge: refused too, by name.
	grant, err := walrelay.GrantMessagesSQL(ctx, b.db.Pool, role)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, grant)
	require.NoError(t, err)
	err = runOnce()
	require.ErrorIs(t, err, walrelay.ErrMessagesOpen)
	require.ErrorContains(t, err, `role(s) "`+role+`" can execute pg_logical_emit_message and may not insert into `+b.db.Tables.OutboxIdent())
	_, err = b.db.Pool.Exec(ctx, "GRANT INSERT ON "+b.db.Tables.OutboxIdent()+" TO "+role)
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
