package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// QueueEmit's insert travels in the caller's pgx.Batch: one round trip for
// the business write and the event, both in the caller's transaction.
func TestQueueEmitSendsWithTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	_, err := db.Pool.Exec(ctx, "CREATE TABLE orders (id UUID PRIMARY KEY, customer TEXT NOT NULL)")
	require.NoError(t, err)

	order := uuid.New()
	var q *outbox.Queued
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		batch.Queue("INSERT INTO orders (id, customer) VALUES ($1, $2)", order, "c-1")
		var err error
		q, err = p.QueueEmit(ctx, batch, outbox.Event{AggregateID: order, Type: "order.placed", Payload: map[string]string{"customer": "c-1"}, Headers: map[string]string{"trace": "t-1"}})
		require.NoError(t, err)
		require.Equal(t, 2, batch.Len())
		return tx.SendBatch(ctx, batch).Close()
	}))
	require.Positive(t, q.ID)
	var agg uuid.UUID
	var typ, payload, headers string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT aggregate_id, type, payload::text, headers::text FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", q.ID).Scan(&agg, &typ, &payload, &headers))
	require.Equal(t, order, agg)
	require.Equal(t, "order.placed", typ)
	require.JSONEq(t, `{"customer": "c-1"}`, payload)
	require.JSONEq(t, `{"trace": "t-1"}`, headers)

	// Rolled back with the business write: nothing.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	batch := &pgx.Batch{}
	batch.Queue("INSERT INTO orders (id, customer) VALUES ($1, $2)", uuid.New(), "c-2")
	_, err = p.QueueEmit(ctx, batch, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1})
	require.NoError(t, err)
	require.NoError(t, tx.SendBatch(ctx, batch).Close())
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 1, countRows(t, db))

	// An invalid event is refused before anything is queued.
	batch = &pgx.Batch{}
	q, err = p.QueueEmit(ctx, batch, outbox.Event{AggregateID: uuid.New(), Type: "order.placed"})
	require.ErrorIs(t, err, outbox.ErrInvalidPayload)
	require.Nil(t, q)
	require.Zero(t, batch.Len())
}

// A Producer sends at most one NOTIFY per NotifyInterval; a negative
// interval notifies on every Emit, and DisableNotify never does.
func TestNotifyInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := setup(t, outbox.Config{})
	listener, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { listener.Close(context.Background()) })
	_, err = listener.Exec(ctx, "LISTEN "+pgident.Quote(db.Tables.Channel()))
	require.NoError(t, err)

	// notifications counts what arrives within a short wait: NOTIFY is
	// delivered at commit, before the emitting transaction returns.
	notifications := func() int {
		n := 0
		for {
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err := listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return n
			}
			n++
		}
	}
	emit := func(p *outbox.Producer, events, perTx int) {
		for range events / perTx {
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				if perTx == 1 {
					_, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "a.b", Payload: 1})
					return err
				}
				evs := make([]outbox.Event, perTx)
				for i := range evs {
					evs[i] = outbox.Event{AggregateID: uuid.New(), Type: "a.b", Payload: i}
				}
				_, err := p.EmitBatch(ctx, tx, evs)
				return err
			}))
		}
	}
	producer := func(cfg outbox.Config) *outbox.Producer {
		cfg.Tables = db.Tables
		p, err := outbox.NewProducer(cfg)
		require.NoError(t, err)
		return p
	}

	slow := producer(outbox.Config{NotifyInterval: time.Hour})
	emit(slow, 5, 1)
	emit(slow, 6, 3)
	require.Equal(t, 1, notifications(), "an hour's interval: one NOTIFY for 7 transactions")

	every := producer(outbox.Config{NotifyInterval: -1})
	emit(every, 4, 1)
	emit(every, 4, 2)
	require.Equal(t, 6, notifications(), "a negative interval: one NOTIFY per transaction")

	quiet := producer(outbox.Config{DisableNotify: true})
	emit(quiet, 3, 1)
	require.Zero(t, notifications())

	def := producer(outbox.Config{})
	require.Equal(t, outbox.DefaultNotifyInterval, def.Config().NotifyInterval)
	emit(def, 1, 1)
	time.Sleep(2 * outbox.DefaultNotifyInterval)
	emit(def, 1, 1)
	require.Equal(t, 2, notifications(), "emits further apart than the interval each notify")
	require.Equal(t, 5+6+4+4+3+1+1, countRows(t, db), "every emit wrote its row, notifying or not")
}
