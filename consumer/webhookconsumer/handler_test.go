package webhookconsumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/webhookconsumer"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/webhookpub"
)

type receiver struct {
	db   *pgtest.DB
	d    *consumer.Dispatcher
	url  string
	mu   sync.Mutex
	dead []consumer.Result
}

// credit is the test's handler: one row per event, in the event's
// transaction; a payload {"bad": true} can never be processed.
func credit(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
	var p struct{ Bad bool }
	if err := json.Unmarshal(ev.Payload, &p); err != nil || p.Bad {
		return consumer.Permanent(errors.New("bad order"))
	}
	_, err := tx.Exec(ctx, "INSERT INTO credited (event_id, aggregate_id) VALUES ($1, $2)", ev.ID, ev.AggregateID)
	return err
}

func newReceiver(t *testing.T, keepDead bool) *receiver {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6})
	_, err := db.Pool.Exec(context.Background(), "CREATE TABLE credited (event_id bigint PRIMARY KEY, aggregate_id uuid NOT NULL)")
	require.NoError(t, err)
	d, err := consumer.NewDispatcher(consumer.DispatcherConfig{Name: "loyalty", Pool: db.Pool, Tables: db.Tables, System: "webhook",
		Handlers: map[string]consumer.Handler{"order.placed": credit}, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	require.NoError(t, err)
	require.NoError(t, d.Check(context.Background()))
	secrets, err := webhookconsumer.ParseSecrets(secretNew)
	require.NoError(t, err)
	v, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: secrets})
	require.NoError(t, err)
	r := &receiver{db: db, d: d}
	cfg := webhookconsumer.HandlerConfig{Dispatcher: d, Verifier: v}
	if keepDead {
		cfg.DeadLetter = func(_ context.Context, _ consumer.Delivery, res consumer.Result) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.dead = append(r.dead, res)
			return nil
		}
	}
	h, err := webhookconsumer.NewHandler(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	r.url = srv.URL + "/outbox"
	return r
}

func (r *receiver) publish(t *testing.T, secret string, msgs []relay.Message) []error {
	t.Helper()
	secrets, err := webhookpub.ParseSecrets(secret)
	require.NoError(t, err)
	pub, err := webhookpub.New(webhookpub.Config{Endpoint: r.url, Secrets: secrets, Source: "shop", MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	require.NoError(t, err)
	return pub.Publish(context.Background(), msgs)
}

func (r *receiver) credited(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, r.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM credited").Scan(&n))
	return n
}

func orders(n int, bad ...int64) []relay.Message {
	aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New()}
	var out []relay.Message
	for i := range n {
		id := int64(i + 1)
		p := `{"n": 1}`
		for _, b := range bad {
			if b == id {
				p = `{"bad": true}`
			}
		}
		out = append(out, relay.Message{ID: id, AggregateID: aggs[i%len(aggs)], Type: "order.placed", Topic: "order", Payload: []byte(p)})
	}
	return out
}

// Every event's effects are applied once, however often the relay sends
// it, and it is answered 2xx only after they are committed.
func TestHandlerAppliesOnce(t *testing.T) {
	t.Parallel()
	r := newReceiver(t, false)
	msgs := orders(20)
	for range 2 {
		for i, err := range r.publish(t, secretNew, msgs) {
			require.NoError(t, err, "event %d", msgs[i].ID)
		}
	}
	require.Equal(t, 20, r.credited(t))
	st := r.d.Stats()
	require.EqualValues(t, 20, st.Processed)
	require.EqualValues(t, 20, st.Duplicates)
}

// An event that can never be processed is answered 422 with the reason:
// the relay holds its row (its aggregate's later events wait), the other
// aggregates' go through. With DeadLetter set, it is kept there and
// answered 204 instead, and its aggregate moves on.
func TestHandlerDeadLetters(t *testing.T) {
	t.Parallel()
	r := newReceiver(t, false)
	msgs := orders(12, 5)
	errs := r.publish(t, secretNew, msgs)
	for i, err := range errs {
		switch {
		case msgs[i].ID == 5:
			require.True(t, relay.IsPermanent(err), "%v", err)
			require.Equal(t, relay.ReasonBrokerRefused, relay.ReasonOf(err))
			require.ErrorContains(t, err, "bad order")
		case msgs[i].AggregateID == msgs[4].AggregateID && msgs[i].ID > 5:
			require.Error(t, err, "after the refused event of its aggregate")
			require.False(t, relay.IsPermanent(err))
		default:
			require.NoError(t, err)
		}
	}
	require.Equal(t, 12-2, r.credited(t), "event 5 held, and 9 after it")

	kept := newReceiver(t, true)
	for _, err := range kept.publish(t, secretNew, msgs) {
		require.NoError(t, err)
	}
	require.Equal(t, 11, kept.credited(t))
	require.Len(t, kept.dead, 1)
	require.Contains(t, kept.dead[0].Reason, "bad order")
	require.EqualValues(t, 5, kept.dead[0].Event.ID)
}

// A request signed with a secret the receiver does not hold is answered
// 401, which the relay holds as not_authorized; nothing is applied.
func TestHandlerRefusesBadSignatures(t *testing.T) {
	t.Parallel()
	r := newReceiver(t, false)
	errs := r.publish(t, secretOld, orders(1))
	require.Equal(t, relay.ReasonNotAuthorized, relay.ReasonOf(errs[0]), "%v", errs[0])
	require.Equal(t, 0, r.credited(t))
}

func TestHandlerConfig(t *testing.T) {
	t.Parallel()
	_, err := webhookconsumer.NewHandler(webhookconsumer.HandlerConfig{})
	require.ErrorContains(t, err, "Dispatcher is required")
}
