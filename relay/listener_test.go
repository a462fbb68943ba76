package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
)

// Two outboxes of one database share one Listener: the server holds one
// LISTEN connection for both relayers, and with a poll interval of an hour
// only its notifications wake them, so every event that arrives was
// announced on it. Killing it makes it reconnect, and it wakes both again.
func TestSharedListenerWakesEachOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	pool, app := b.appPool(t, 4)
	second := outbox.Tables{Schema: b.db.Tables.Schema, Outbox: "second_outbox"}.WithDefaults()
	m, err := migrate.New(second)
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)

	l := relay.NewListener(pool, nil, b.db.Tables, second)
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(lctx) }()
	t.Cleanup(func() { stop(); <-done })
	for _, tables := range []outbox.Tables{b.db.Tables, second} {
		run(t, b.relayer(t, func(c *relay.Config) {
			c.Pool, c.Tables, c.Listener, c.PollInterval, c.BusyPollInterval = pool, tables, l, time.Hour, -1
		}))
	}
	require.Eventually(t, func() bool { return b.listening(t, app) }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, listeners(t, b, app), "one LISTEN connection serves both outboxes")

	for round := range 2 {
		for _, tables := range []outbox.Tables{b.db.Tables, second} {
			p, err := outbox.NewProducer(outbox.Config{Tables: tables})
			require.NoError(t, err)
			require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				_, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{"round": round}})
				return err
			}))
			require.Eventually(t, func() bool { return pendingIn(t, b, tables) == 0 }, 10*time.Second, 5*time.Millisecond,
				"round %d: %s: the shared listener did not wake its relayer", round, tables.OutboxIdent())
		}
		if round == 0 {
			b.terminate(t, app, "query LIKE 'LISTEN %'")
			require.Eventually(t, func() bool { return b.listening(t, app) }, 10*time.Second, 10*time.Millisecond, "the listener did not reconnect")
		}
	}
}

// A relayer refuses a Listener that does not listen for its outbox.
func TestListenerOfAnotherOutboxIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := relay.NewListener(b.db.Pool, nil, outbox.Tables{Schema: b.db.Tables.Schema, Outbox: "other"})
	_, err := relay.New(relay.Config{Common: relay.Common{Pool: b.db.Pool, Sink: b.publisher(t), Tables: b.db.Tables}, Listener: l})
	require.ErrorContains(t, err, "does not listen for this outbox")
	_, err = relay.New(relay.Config{Common: relay.Common{Pool: b.db.Pool, Sink: b.publisher(t), Tables: b.db.Tables}, Listener: l, PollOnly: true})
	require.NoError(t, err, "a poll-only relayer listens to nothing")
}

func listeners(t *testing.T, b *bundle, app string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'", app).Scan(&n))
	return n
}

func pendingIn(t *testing.T, b *bundle, tables outbox.Tables) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+tables.OutboxIdent()+" WHERE dispatched_at IS NULL").Scan(&n))
	return n
}
