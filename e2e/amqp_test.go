package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

func amqpRelayArgs(db *pgtest.DB, sink string, extra ...string) []string {
	return append([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--sink", sink,
		"--batch-size", fmt.Sprint(batchSize), "--poll-interval", "100ms", "--delivery-timeout", "5s", "--log-level", "warn"}, extra...)
}

// amqpQueue declares, on the server at url, a durable topic exchange of
// the test's own and a durable queue bound to it for key, both deleted
// when t ends, and returns the exchange's name (the queue's too).
func amqpQueue(t *testing.T, url, key string) string {
	t.Helper()
	ch := rabbittest.Channel(t, rabbittest.Dial(t, url))
	name := "e2e-" + uuid.NewString()
	require.NoError(t, ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil))
	_, err := ch.QueueDeclare(name, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(name, key, name, false, nil))
	t.Cleanup(func() {
		ch, err := rabbittest.Dial(t, url).Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})
	return name
}

// readQueue takes everything from queue, until at least want messages
// came and none for a second.
func readQueue(t *testing.T, url, queue string, want int, timeout time.Duration) []delivered {
	t.Helper()
	conn := rabbittest.Dial(t, url)
	var out []delivered
	for _, d := range rabbittest.Get(t, conn, queue, want, time.Second, timeout) {
		id, err := strconv.ParseInt(d.MessageId, 10, 64)
		require.NoError(t, err, "message_id %q", d.MessageId)
		src, _ := d.Headers[outbox.HeaderEventSource].(string)
		key, _ := d.Headers[outbox.HeaderAggregateID].(string)
		out = append(out, delivered{key: key, id: id, source: src, at: d.Timestamp})
	}
	return out
}

// SIGKILL the relayer at random moments, ten times, during a 20,000-event
// run on RabbitMQ: every committed event reaches the queue, each
// aggregate's first deliveries in order, duplicates bounded by a batch
// per kill.
func TestAMQPRelayerSurvivesTenSIGKILLs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("20,000 events and ten process kills; skipped with -short")
	}
	url := rabbittest.URL()
	ex := amqpQueue(t, url, "order.#")
	sink := url + "?exchange=" + ex
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, context.Background(), db, 20_000, 200, 4, 50, 3*time.Second) }()

	p := start(t, amqpRelayArgs(db, sink)...)
	http := freeAddr(t)
	for i := range 10 {
		time.Sleep(time.Duration(150+rand.IntN(600)) * time.Millisecond)
		p.signal(t, syscall.SIGKILL)
		p.wait(t, 10*time.Second)
		var extra []string
		if i == 9 {
			extra = []string{"--http", http}
		}
		p = start(t, amqpRelayArgs(db, sink, extra...)...)
	}
	waitListening(t, http)
	committed := <-done
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 180*time.Second, 100*time.Millisecond, "outbox did not drain; relayer output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0; output:\n%s", p.out.String())

	got := readQueue(t, url, ex, 20_000, 120*time.Second)
	dups := verify(t, committed, got)
	t.Logf("20,000 events, 10 SIGKILLs: %d messages read, %d duplicates (bound %d)", len(got), dups, 10*batchSize)
	require.LessOrEqual(t, dups, 10*batchSize, "duplicates bounded by one batch per kill")
}

// Three relayers drain one outbox to RabbitMQ at once, while producers
// write: nothing lost, and each aggregate's events reach the queue in
// commit order whichever relayer sent them.
func TestAMQPThreeRelayersKeepOrder(t *testing.T) {
	t.Parallel()
	url := rabbittest.URL()
	ex := amqpQueue(t, url, "order.#")
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, context.Background(), db, 10_000, 50, 4, 20, 3*time.Second) }()
	var ps []*proc
	for i := range 3 {
		ps = append(ps, start(t, amqpRelayArgs(db, url+"?exchange="+ex, "--source", fmt.Sprintf("relay-%d", i), "--batch-size", "100")...))
	}
	committed := <-done
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 120*time.Second, 100*time.Millisecond, "outbox did not drain")
	for _, p := range ps {
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t, 30*time.Second))
	}
	got := readQueue(t, url, ex, 10_000, 60*time.Second)
	dups := verify(t, committed, got)
	sources := map[string]int{}
	for _, d := range got {
		sources[d.source]++
	}
	t.Logf("10,000 events, 3 relayers: %d duplicates; messages per relayer %v", dups, sources)
}

// Each poison shape RabbitMQ shows is held on its own row with its
// reason, while the rows beside it go through: a body over the sink's
// max_bytes (too_large), a type no queue is bound for (invalid_topic:
// the server returned it), a routing key the user may not write
// (not_authorized: topic permissions), and a row whose own headers use
// aggregate_id (reserved_header). An aggregate's rows after its held one
// wait behind it.
func TestAMQPPoisonRowsHeld(t *testing.T) {
	t.Parallel()
	url := rabbittest.URL()
	ex := amqpQueue(t, url, "#")
	// guest may write only order.* and nobody.* keys on this exchange.
	ctl := func(args ...string) {
		out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
		require.NoError(t, err, "rabbitmqctl %v: %s", args, out)
	}
	ctl("set_topic_permissions", "-p", "/", "guest", ex, `^(order|nobody)\.`, ".*")
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "clear_topic_permissions", "-p", "/", "guest", ex).Run() })
	ch := rabbittest.Channel(t, rabbittest.Dial(t, url))
	require.NoError(t, ch.QueueUnbind(ex, "#", ex, nil))
	require.NoError(t, ch.QueueBind(ex, "order.#", ex, false, nil))
	require.NoError(t, ch.QueueBind(ex, "secret.#", ex, false, nil))

	db := pgtest.New(t)
	ctx := context.Background()
	prod, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	a := uuid.New()
	evs := []outbox.Event{
		{AggregateID: a, Type: "order.placed", Payload: map[string]int{"n": 1}},
		{AggregateID: a, Type: "order.placed", Payload: map[string]string{"pad": strings.Repeat("x", 5000)}},
		{AggregateID: a, Type: "order.placed", Payload: map[string]int{"n": 3}},
		{AggregateID: uuid.New(), Type: "nobody.listens", Payload: map[string]int{}},
		{AggregateID: uuid.New(), Type: "secret.event", Payload: map[string]int{}},
		{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{}, Headers: map[string]string{outbox.HeaderAggregateID: "mine"}},
	}
	for range 20 {
		evs = append(evs, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: map[string]int{}})
	}
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		ids, err = prod.EmitBatch(ctx, tx, evs)
		return err
	}))
	p := start(t, amqpRelayArgs(db, url+"?exchange="+ex+"&max_bytes=2000")...)

	failures := pgx.Identifier{db.Tables.Schema, db.Tables.WithDefaults().Outbox + "_failures"}.Sanitize()
	held := map[int64]string{}
	require.Eventually(t, func() bool {
		rows, err := db.Pool.Query(ctx, "SELECT event_id, reason FROM "+failures)
		require.NoError(t, err)
		held = map[int64]string{}
		for rows.Next() {
			var id int64
			var reason string
			require.NoError(t, rows.Scan(&id, &reason))
			held[id] = reason
		}
		require.NoError(t, rows.Err())
		return len(held) == 4 && pending(t, db) == 5
	}, 60*time.Second, 100*time.Millisecond, "4 rows held and 5 pending (the held ones and the row behind one); relayer output:\n%s", p.out.String())
	require.Equal(t, map[int64]string{ids[1]: "too_large", ids[3]: "invalid_topic", ids[4]: "not_authorized", ids[5]: "reserved_header"}, held)
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))

	got := map[int64]bool{}
	for _, d := range readQueue(t, url, ex, 21, 30*time.Second) {
		got[d.id] = true
	}
	require.Len(t, got, 21, "the first row of the aggregate and the 20 beside")
	require.True(t, got[ids[0]])
	require.False(t, got[ids[2]], "the row behind a held one waits")
}

// The RabbitMQ node (a private one) is killed with SIGKILL mid-drain and
// started again on its data a few seconds later: the relayer backs off,
// reconnects by itself and loses nothing, since it marks a row
// dispatched only once the server confirmed it, which a durable queue
// does once the message is on disk.
func TestAMQPServerKilledMidDrain(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a private RabbitMQ node, killed and restarted; skipped with -short")
	}
	node := rabbittest.StartNode(t, rabbittest.NodeOptions{})
	ex := amqpQueue(t, node.URL(), "order.#")
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	done := make(chan map[uuid.UUID][]int64, 1)
	go func() { done <- writers(t, context.Background(), db, 10_000, 100, 2, 20, 6*time.Second) }()
	p := start(t, amqpRelayArgs(db, node.URL()+"?exchange="+ex)...)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()+" WHERE dispatched_at IS NOT NULL").Scan(&n))
		return n >= 1000
	}, 60*time.Second, 20*time.Millisecond, "the relayer publishes before the kill")
	node.Kill()
	time.Sleep(3 * time.Second)
	node.Start()
	committed := <-done
	require.Eventually(t, func() bool { return pending(t, db) == 0 }, 180*time.Second, 100*time.Millisecond, "outbox did not drain; relayer output:\n%s", p.out.String())
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))
	got := readQueue(t, node.URL(), ex, 10_000, 60*time.Second)
	dups := verify(t, committed, got)
	t.Logf("10,000 events, the node killed and restarted mid-drain: %d messages read, %d duplicates", len(got), dups)
}

// The WAL source publishes to RabbitMQ through the same --sink: every
// committed event reaches the queue, each aggregate's in order.
func TestAMQPWALSource(t *testing.T) {
	t.Parallel()
	url := rabbittest.URL()
	ex := amqpQueue(t, url, "order.#")
	db := pgtest.New(t, pgtest.Options{MaxConns: 8, ServerURL: needLogical(t)})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil && walrelay.Teardown(ctx, db.Pool, slot, slot) != nil {
			time.Sleep(100 * time.Millisecond)
		}
	})
	p := start(t, amqpRelayArgs(db, url+"?exchange="+ex, "--mode", "wal", "--source", "wal-amqp", "--heartbeat-interval", "500ms")...)
	require.Eventually(t, func() bool { return readSlot(t, db.Pool, slot).streaming() }, 60*time.Second, 20*time.Millisecond,
		"the relayer never streamed; output:\n%s", p.out.String())
	committed := writers(t, context.Background(), db, 5_000, 100, 2, 20, 2*time.Second)
	got := readQueue(t, url, ex, 5_000, 60*time.Second)
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))
	dups := verify(t, committed, got)
	for _, d := range got {
		require.Equal(t, "wal-amqp", d.source)
	}
	t.Logf("5,000 events through the WAL source: %d duplicates", dups)
}
