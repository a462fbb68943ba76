package walrelay_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
)

// Every producer entry point, in each emit mode, reaches the broker
// through the WAL source: the ids it returns are the event_id headers, in
// input and commit order per aggregate, with the payload and headers as
// written; a rolled-back transaction publishes nothing; and the table
// keeps a row only in ModeInsert.
func TestProducerModesThroughTheWAL(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.Mode{outbox.ModeInsert, outbox.ModeInsertDelete, outbox.ModeMessage} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables, Mode: mode, DisableAggregateLock: true, DisableNotify: true})
			require.NoError(t, err)
			r := b.relayer(t, nil)
			run(t, r)
			waitLeading(t, r)
			sdb, err := sql.Open("pgx", b.db.URL)
			require.NoError(t, err)
			t.Cleanup(func() { _ = sdb.Close() })

			aggs := []uuid.UUID{uuid.New(), uuid.New()}
			type sent struct {
				agg uuid.UUID
				n   int
			}
			var (
				want []int64
				byID = map[int64]sent{}
				n    int
			)
			ev := func(i int) outbox.Event {
				n++
				return outbox.Event{AggregateID: aggs[i%2], Type: "order.placed", Payload: map[string]any{"n": n, "mode": mode.String()},
					Headers: map[string]string{"x-n": fmt.Sprint(n)}}
			}
			record := func(ids []int64, evs ...outbox.Event) {
				require.Len(t, ids, len(evs))
				for i, id := range ids {
					want = append(want, id)
					byID[id] = sent{agg: evs[i].AggregateID, n: evs[i].Payload.(map[string]any)["n"].(int)}
				}
			}
			for i := range 3 {
				// Emit, twice in one transaction.
				require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					e1, e2 := ev(i), ev(i+1)
					id1, err := p.Emit(ctx, tx, e1)
					if err != nil {
						return err
					}
					id2, err := p.Emit(ctx, tx, e2)
					if err != nil {
						return err
					}
					record([]int64{id1, id2}, e1, e2)
					return nil
				}))
				// EmitBatch of five over both aggregates.
				require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					evs := []outbox.Event{ev(0), ev(1), ev(0), ev(0), ev(1)}
					ids, err := p.EmitBatch(ctx, tx, evs)
					if err != nil {
						return err
					}
					record(ids, evs...)
					return nil
				}))
				// QueueEmit beside a statement of the caller's.
				require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					batch := &pgx.Batch{}
					batch.Queue("SELECT 1")
					e := ev(i)
					q, err := p.QueueEmit(ctx, batch, e)
					if err != nil {
						return err
					}
					if err := tx.SendBatch(ctx, batch).Close(); err != nil {
						return err
					}
					record([]int64{q.ID}, e)
					return nil
				}))
				// database/sql, one and a batch.
				tx, err := sdb.BeginTx(ctx, nil)
				require.NoError(t, err)
				e := ev(i)
				id, err := p.EmitSQL(ctx, tx, e)
				require.NoError(t, err)
				evs := []outbox.Event{ev(1), ev(0)}
				ids, err := p.EmitBatchSQL(ctx, tx, evs)
				require.NoError(t, err)
				require.NoError(t, tx.Commit())
				record([]int64{id}, e)
				record(ids, evs...)
			}
			// Rolled back: never published.
			rolled := map[int64]bool{}
			require.ErrorIs(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				id, err := p.Emit(ctx, tx, ev(0))
				require.NoError(t, err)
				ids, err := p.EmitBatch(ctx, tx, []outbox.Event{ev(0), ev(1)})
				require.NoError(t, err)
				rolled[id] = true
				for _, id := range ids {
					rolled[id] = true
				}
				return errRollback
			}), errRollback)
			// A last committed event after the rolled-back ones shows they
			// had their chance to be published.
			require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				e := ev(0)
				id, err := p.Emit(ctx, tx, e)
				record([]int64{id}, e)
				return err
			}))

			recs := kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeastThenQuiet(len(want), 500*time.Millisecond), "order")
			require.Len(t, recs, len(want), "each event once")
			last := map[string]int{}
			seen := map[int64]bool{}
			for _, rec := range recs {
				id := kafkatest.EventID(rec)
				require.False(t, rolled[id], "event %d of a rolled-back transaction was published", id)
				s, ok := byID[id]
				require.True(t, ok, "event %d was never emitted", id)
				seen[id] = true
				require.Equal(t, s.agg.String(), string(rec.Key))
				var payload struct {
					N    int    `json:"n"`
					Mode string `json:"mode"`
				}
				require.NoError(t, json.Unmarshal(rec.Value, &payload))
				require.Equal(t, s.n, payload.N)
				require.Equal(t, mode.String(), payload.Mode)
				h := kafkatest.Headers(rec)
				require.Equal(t, fmt.Sprint(s.n), h["x-n"])
				require.Equal(t, "order.placed", h[outbox.HeaderEventType])
				// n grows with input order, which is commit order here.
				require.Greater(t, s.n, last[string(rec.Key)], "aggregate %s out of order", rec.Key)
				last[string(rec.Key)] = s.n
			}
			require.Len(t, seen, len(want))

			var rows int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.db.Tables.OutboxIdent()).Scan(&rows))
			if mode == outbox.ModeInsert {
				require.Equal(t, len(want), rows)
			} else {
				require.Zero(t, rows, "%s leaves no row", mode)
			}
		})
	}
}

var errRollback = fmt.Errorf("roll back")

// A JSON null payload, which Emit accepts, is published as "null" in every
// mode, as the polling relay publishes a row's: the mode changes how an
// event is written, never whether it is delivered.
func TestNullPayloadIsPublishedInEveryMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relayer(t, nil)
	run(t, r)
	waitLeading(t, r)
	var want []int64
	for _, mode := range []outbox.Mode{outbox.ModeInsert, outbox.ModeInsertDelete, outbox.ModeMessage} {
		p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables, Mode: mode, DisableAggregateLock: true, DisableNotify: true})
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.cleared", Payload: json.RawMessage("null")})
			want = append(want, id)
			return err
		}))
	}
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeastThenQuiet(len(want), 300*time.Millisecond), "order")
	var got []int64
	for _, rec := range recs {
		got = append(got, kafkatest.EventID(rec))
		require.Equal(t, "null", string(rec.Value))
	}
	require.ElementsMatch(t, want, got, "each once (three aggregates: no order between them)")
	require.Zero(t, r.Stats().Parked)
}
