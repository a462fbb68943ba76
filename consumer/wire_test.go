package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
)

// A record carrying a reserved header twice can only come from a producer
// other than the relayer (kcat, a hand-built record): the relayer writes
// its own first, so the consumer reads the first. A second event_source
// must not change the dedupe key, a second event_id the event, nor a
// second event_type the handler; other repeated headers keep their last
// value.
func TestConsumerDedupesOnTheRelayersHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		mu   sync.Mutex
		seen []consumer.Event
	)
	c, err := consumer.New(b.config(map[string]consumer.Handler{"item.ok": func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		mu.Lock()
		seen = append(seen, ev)
		mu.Unlock()
		return record(ctx, tx, ev)
	}}))
	require.NoError(t, err)
	produce(t, b.producer(t),
		event("t", 0, 5, "item.ok", `{}`, outbox.HeaderEventSource, "relayer-src", outbox.HeaderEventSource, "evil", "trace", "t1", "trace", "t2"),
		// The same event from the same outbox: a duplicate, whatever the
		// second event_source says.
		event("t", 0, 5, "item.ok", `{}`, outbox.HeaderEventSource, "relayer-src", outbox.HeaderEventSource, "other"),
		// Event 6, of type item.ok (item.unknown would be dead-lettered).
		event("t", 0, 6, "item.ok", `{}`, outbox.HeaderEventSource, "relayer-src", outbox.HeaderEventID, "7", outbox.HeaderEventType, "item.unknown"),
	)
	run(t, c)
	require.Eventually(t, func() bool { st := c.Stats(); return st.Processed+st.Duplicates+st.DeadLettered == 3 }, 20*time.Second, 20*time.Millisecond)
	st := c.Stats()
	require.EqualValues(t, 2, st.Processed)
	require.EqualValues(t, 1, st.Duplicates)
	require.Zero(t, st.DeadLettered)

	rows, err := b.db.Pool.Query(context.Background(), "SELECT consumer, source, event_id FROM "+b.db.Tables.ProcessedIdent()+" ORDER BY event_id")
	require.NoError(t, err)
	type key struct {
		Consumer, Source string
		EventID          int64
	}
	keys, err := pgx.CollectRows(rows, pgx.RowToStructByPos[key])
	require.NoError(t, err)
	require.Equal(t, []key{{"test", "relayer-src", 5}, {"test", "relayer-src", 6}}, keys)
	require.Equal(t, map[string]int{"relayer-src/5": 1, "relayer-src/6": 1}, b.effects(t))

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	ev := seen[0]
	require.Equal(t, "relayer-src", ev.Source)
	require.Equal(t, "relayer-src", ev.Headers[outbox.HeaderEventSource], "Headers agrees with Source")
	require.Equal(t, "t2", ev.Headers["trace"], "a repeated header of the event's own keeps its last value")
	ev = seen[1]
	require.EqualValues(t, 6, ev.ID)
	require.Equal(t, "6", ev.Headers[outbox.HeaderEventID])
	require.Equal(t, "item.ok", ev.Type)
	require.Equal(t, "item.ok", ev.Headers[outbox.HeaderEventType])
}
