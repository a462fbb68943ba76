package relay_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
)

// start runs r until the returned cancel; done delivers Run's result.
func start(r *relay.Relayer) (cancel context.CancelFunc, done <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- r.Run(ctx) }()
	return cancel, ch
}

// waitRun waits for Run to return, within d.
func waitRun(t *testing.T, done <-chan error, d time.Duration) time.Duration {
	t.Helper()
	begin := time.Now()
	select {
	case err := <-done:
		require.NoError(t, err, "Run returns nil when its context is cancelled")
	case <-time.After(d):
		t.Fatalf("Run did not return within %s of cancellation", d)
	}
	return time.Since(begin)
}

// An idle relayer waiting out a long poll interval returns as soon as it
// is cancelled.
func TestRelayerStopsPromptlyWhenIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, app := b.appPool(t, 2)
	r := b.relayer(t, func(c *relay.Config) { c.Pool = pool; c.PollInterval = time.Hour })
	cancel, done := start(r)
	defer cancel()
	require.Eventually(t, func() bool { return b.listening(t, app) }, 10*time.Second, 10*time.Millisecond)
	cancel()
	took := waitRun(t, done, 5*time.Second)
	t.Logf("idle relayer stopped %s after cancellation", took.Round(time.Millisecond))
}

// blockingPublisher holds the first batch until released (or until its
// context ends), then publishes it through its Sink.
type blockingPublisher struct {
	relay.Sink
	entered chan struct{}
	release chan struct{}
	first   atomic.Bool
}

func newBlockingPublisher() *blockingPublisher {
	return &blockingPublisher{entered: make(chan struct{}), release: make(chan struct{})}
}

func (p *blockingPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	if p.first.CompareAndSwap(false, true) {
		close(p.entered)
		select {
		case <-p.release:
		case <-ctx.Done():
			errs := make([]error, len(msgs))
			for i := range errs {
				errs[i] = ctx.Err()
			}
			return errs
		}
	}
	return p.Sink.Publish(ctx, msgs)
}

// Cancelled mid-batch, a relayer finishes the batch (published and marked
// in one commit) before Run returns: a SIGTERM loses nothing and leaves
// nothing to send twice.
func TestRelayerFinishesInFlightBatchOnStop(t *testing.T) {
	t.Parallel()
	const events = 100
	b := setup(t)
	b.preload(t, events, 10, "order.placed")
	pub := newBlockingPublisher()
	r := b.relayer(t, func(c *relay.Config) {
		pub.Sink = c.Sink
		c.Sink = pub
	})
	cancel, done := start(r)
	defer cancel()
	select {
	case <-pub.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the relayer did not start publishing within 10s")
	}
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while its batch was still being published", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(pub.release)
	waitRun(t, done, 10*time.Second)
	require.Zero(t, b.pending(t), "the in-flight batch must be committed")
	require.EqualValues(t, events, r.Stats().Dispatched)
	recs := b.consume(t, events, 20*time.Second, "order")
	require.Len(t, recs, events, "each event exactly once")
}

// Past ShutdownTimeout the in-flight batch is abandoned: rolled back, its
// rows still pending for the next relayer, and Run still returns nil.
func TestRelayerAbandonsBatchAfterShutdownTimeout(t *testing.T) {
	t.Parallel()
	const events = 100
	b := setup(t)
	b.preload(t, events, 10, "order.placed")
	pub := newBlockingPublisher() // never released: only its context ends it
	r := b.relayer(t, func(c *relay.Config) {
		c.ShutdownTimeout = 200 * time.Millisecond
		pub.Sink = c.Sink
		c.Sink = pub
	})
	cancel, done := start(r)
	defer cancel()
	select {
	case <-pub.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the relayer did not start publishing within 10s")
	}
	cancel()
	waitRun(t, done, 10*time.Second)
	require.Equal(t, events, b.pending(t), "an abandoned batch is rolled back")
	require.Zero(t, r.Stats().Dispatched)
}

// With a poll interval of an hour, only NOTIFY can wake an idle relayer:
// events committed while it waits are published within seconds. Three
// rounds, so a wake-up from the listener connecting cannot pass for one.
func TestNotifyWakesIdleRelayer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, app := b.appPool(t, 2)
	r := b.relayer(t, func(c *relay.Config) { c.Pool = pool; c.PollInterval = time.Hour })
	run(t, r)
	require.Eventually(t, func() bool { return b.listening(t, app) }, 10*time.Second, 10*time.Millisecond)
	for round := range 3 {
		id := b.emit(t, uuid.New(), "order.placed", map[string]int{"round": round})
		begin := time.Now()
		require.Eventually(t, func() bool { return b.pending(t) == 0 }, 10*time.Second, 5*time.Millisecond,
			"round %d: event %d not published; NOTIFY did not wake the relayer", round, id)
		t.Logf("round %d: event %d published %s after commit", round, id, time.Since(begin).Round(time.Millisecond))
	}
	// The counter moves just after the commit that emptied the outbox.
	require.Eventually(t, func() bool { return r.Stats().Dispatched == 3 }, 5*time.Second, 5*time.Millisecond, "dispatched %d, want 3", r.Stats().Dispatched)
}

// Poll-only mode (for transaction-mode poolers) holds no LISTEN and still
// publishes, at its poll interval.
func TestPollOnlyRelayerPublishes(t *testing.T) {
	t.Parallel()
	const events = 20
	b := setup(t)
	pool, app := b.appPool(t, 2)
	r := b.relayer(t, func(c *relay.Config) { c.Pool = pool; c.PollOnly = true; c.PollInterval = 50 * time.Millisecond })
	run(t, r)
	committed := b.emitSpread(t, events, 4, "order.placed")
	b.waitDrained(t, 10*time.Second)
	var backends int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&backends))
	require.Positive(t, backends, "the relayer's connections should be visible")
	require.False(t, b.listening(t, app), "a poll-only relayer must not LISTEN")
	checkDelivered(t, committed, b.consume(t, events, 20*time.Second, "order"))
}

// Every database connection of a relayer, its LISTEN included, is killed
// several times while writers commit: it reconnects, the listener comes
// back (the poll interval is an hour, so only NOTIFY wakes it), and every
// event is published in order.
func TestRelayerRidesOutTerminatedConnections(t *testing.T) {
	t.Parallel()
	const events, aggregates, writers, kills = 2_000, 20, 2, 3
	b := setup(t)
	pool, app := b.appPool(t, 2)
	r := b.relayer(t, func(c *relay.Config) { c.Pool = pool; c.PollInterval = time.Hour; c.BatchSize = 100 })
	run(t, r)
	require.Eventually(t, func() bool { return b.listening(t, app) }, 10*time.Second, 10*time.Millisecond)

	var committed map[int64]uuid.UUID
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		committed = b.writeLoad(t, events, aggregates, writers, "order.placed")
	}()
	killed := 0
	for i := range kills {
		target := int64(events * (i + 1) / (kills + 2))
		require.Eventually(t, func() bool { return r.Stats().Dispatched >= target }, 30*time.Second, 5*time.Millisecond)
		killed += b.terminate(t, app, "")
		require.Eventually(t, func() bool { return b.listening(t, app) }, 10*time.Second, 10*time.Millisecond,
			"the listener did not reconnect after kill %d", i+1)
	}
	select {
	case <-wrote:
	case <-time.After(60 * time.Second):
		t.Fatal("writers did not finish within 60s")
	}
	require.Len(t, committed, events)
	b.waitDrained(t, 30*time.Second)
	recs := b.consume(t, events, 30*time.Second, "order")
	dups := checkDelivered(t, committed, recs)
	s := r.Stats()
	t.Logf("%d kills (%d backends); %d batches, %d failed; %d records, %d duplicates", kills, killed, s.Batches, s.FailedBatches, len(recs), dups)
}

// After a batch that found rows the relayer keeps claiming for a while
// (BusyPollInterval, doubling): an event that sent no NOTIFY, committed
// just after, is relayed without waiting for the poll interval; with busy
// polling off it waits for the poll.
func TestBusyPollingFindsEventsThatDidNotNotify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		busy  time.Duration
		found bool
	}{{"default", 0, true}, {"off", -1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := b.relayer(t, func(c *relay.Config) {
				c.PollInterval = time.Minute
				c.BusyPollInterval = tc.busy
			})
			run(t, r)
			quiet, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables, DisableNotify: true})
			require.NoError(t, err)

			b.emit(t, uuid.New(), "order.placed", 1) // notifies: wakes the relayer
			b.waitDrained(t, 10*time.Second)
			// A wake-up can be left over: the listener's own on connecting
			// (or the notification) when the claim it would trigger was
			// already under way. Let its claim pass before the quiet event,
			// or that claim finds it; on a loaded machine it can come late.
			time.Sleep(500 * time.Millisecond)
			require.NoError(t, pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
				_, err := quiet.Emit(context.Background(), tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 2})
				return err
			}))
			if tc.found {
				b.waitDrained(t, 10*time.Second)
				return
			}
			time.Sleep(2 * time.Second)
			require.Equal(t, 1, b.pending(t), "with busy polling off, an event without NOTIFY waits for the poll interval")
		})
	}
}
