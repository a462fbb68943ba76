package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
)

// crashingPublisher publishes through inner and, on batch crashOn, lets
// crash run after the broker acknowledged and before the relayer can mark
// the rows: the window a process crash would hit.
type crashingPublisher struct {
	inner   relay.Publisher
	crashOn int
	crash   func()

	mu      sync.Mutex
	batches int
	crashed []int64 // ids of the batch that was published but not marked
}

func (p *crashingPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := p.inner.Publish(ctx, msgs)
	p.mu.Lock()
	p.batches++
	n := p.batches
	if n == p.crashOn {
		for i, m := range msgs {
			if errs[i] == nil {
				p.crashed = append(p.crashed, m.ID)
			}
		}
	}
	p.mu.Unlock()
	if n == p.crashOn {
		p.crash()
	}
	return errs
}

// emitSpread commits n events round-robin over aggregates, a few per
// transaction, and returns the aggregate of each by id.
func (b *bundle) emitSpread(t *testing.T, n, aggregates int, typ string) map[int64]uuid.UUID {
	t.Helper()
	ctx := context.Background()
	aggs := make([]uuid.UUID, aggregates)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	committed := make(map[int64]uuid.UUID, n)
	for i := 0; i < n; i += 50 {
		batch := make([]outbox.Event, 0, 50)
		for j := i; j < min(i+50, n); j++ {
			batch = append(batch, outbox.Event{AggregateID: aggs[j%aggregates], Type: typ, Payload: map[string]int{"n": j}})
		}
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			ids, err := b.producer.EmitBatch(ctx, tx, batch)
			for k, id := range ids {
				committed[id] = batch[k].AggregateID
			}
			return err
		}))
	}
	return committed
}

// A relayer dies after the broker acknowledged a batch and before the
// marking commit: its database connection is killed and its process
// stops. The batch stays pending, and a fresh relayer sends it again:
// every event arrives at least once, and the first delivery of each event
// still follows per-aggregate order.
func TestCrashBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	const events, aggregates, batch = 3_000, 40, 200
	b := setup(t)
	committed := b.emitSpread(t, events, aggregates, "order.placed")

	pool, app := b.appPool(t, 2)
	ctx1, crash1 := context.WithCancel(context.Background())
	defer crash1()
	pub := &crashingPublisher{crashOn: 3, crash: func() {
		// The relayer's transaction is open, idle between publish and
		// commit: kill it (and the next batch's, claimed meanwhile, if its
		// claim is done), then stop the "process".
		killed := b.terminate(t, app, "state = 'idle in transaction'")
		assert.True(t, killed == 1 || killed == 2, "%d open relay transactions; want the publishing batch's and perhaps the next one's", killed)
		crash1()
	}}
	r1 := b.relayer(t, func(c *relay.Config) {
		c.Pool = pool
		c.BatchSize = batch
		pub.inner = c.Publisher
		c.Publisher = pub
	})
	done := make(chan error, 1)
	go func() { done <- r1.Run(ctx1) }()
	select {
	case err := <-done:
		require.NoError(t, err, "a crashed relayer's Run still returns nil on cancel")
	case <-time.After(30 * time.Second):
		t.Fatal("the first relayer did not reach its crash within 30s")
	}
	pub.mu.Lock()
	crashed := pub.crashed
	pub.mu.Unlock()
	require.Len(t, crashed, batch, "the crashed batch was acknowledged in full")
	var stillPending int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+b.db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL AND id = ANY($1)", crashed).Scan(&stillPending))
	require.Equal(t, batch, stillPending, "the crashed batch must not be marked: its commit never happened")
	require.EqualValues(t, 2*batch, r1.Stats().Dispatched, "two batches committed before the crash")

	r2 := b.relayer(t, func(c *relay.Config) { c.BatchSize = batch })
	run(t, r2)
	b.waitDrained(t, 30*time.Second)

	recs := b.consume(t, events+batch, 30*time.Second, "order")
	dups := checkDelivered(t, committed, recs)
	t.Logf("%d events, crash after batch %d of %d rows: %d records, %d duplicates", events, pub.crashOn, batch, len(recs), dups)
	require.Equal(t, batch, dups, "exactly the crashed batch is delivered twice")
}

// gatedPublisher lets a test change the broker's faults between batches,
// never while one is being published.
type gatedPublisher struct {
	inner relay.Publisher
	mu    sync.Mutex
}

func (p *gatedPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inner.Publish(ctx, msgs)
}

// between runs fn while no batch is being published.
func (p *gatedPublisher) between(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn()
}

// Broker failures mid-run, while writers keep committing: first retriable
// errors, which the client retries inside one publish; then an outage in
// which every produce request fails with an error the client does not
// retry, so whole batches fail, go back to pending and are retried with
// backoff until the broker recovers. Nothing is lost and per-aggregate
// order holds.
func TestBrokerFaultsLoseNothing(t *testing.T) {
	t.Parallel()
	const events, aggregates, writers = 4_000, 40, 4
	b := setup(t)
	gate := &gatedPublisher{}
	// A retriable error sends the client to refresh its metadata, at most
	// once per MetadataMinAge (5s by default, as long as the test's
	// delivery timeout): keep it short so retries succeed within a publish.
	gate.inner = b.publisher(t, kgo.MetadataMinAge(100*time.Millisecond))
	r := b.relayer(t, func(c *relay.Config) {
		c.BatchSize = 200
		c.Publisher = gate
	})
	run(t, r)

	var committed map[int64]uuid.UUID
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		committed = b.writeLoad(t, events, aggregates, writers, "order.placed")
	}()
	require.Eventually(t, func() bool { return r.Stats().Dispatched > 300 }, 30*time.Second, 5*time.Millisecond)
	var retriable, outage *kfake.FaultHandle
	gate.between(func() {
		retriable = b.broker.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: 2})
	})
	waitHits(t, retriable, 2)
	failedBefore := r.Stats().FailedBatches
	gate.between(func() {
		// CORRUPT_MESSAGE: the client does not retry it; the records fail.
		outage = b.broker.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.CorruptMessage, Count: -1})
	})
	require.Eventually(t, func() bool { return r.Stats().FailedBatches >= failedBefore+3 }, 30*time.Second, 5*time.Millisecond,
		"the outage should fail batches")
	gate.between(outage.Remove)
	select {
	case <-wrote:
	case <-time.After(60 * time.Second):
		t.Fatal("writers did not finish within 60s")
	}
	require.Len(t, committed, events)
	b.waitDrained(t, 30*time.Second)

	s := r.Stats()
	recs := b.consume(t, events, 30*time.Second, "order")
	dups := checkDelivered(t, committed, recs)
	t.Logf("%d events; %d retriable faults, %d failed produce requests in the outage; %d batches, %d failed batches (%d in the outage), %d transient row failures; %d records, %d duplicates",
		events, retriable.Hits(), outage.Hits(), s.Batches, s.FailedBatches, s.FailedBatches-failedBefore, s.TransientFailures, len(recs), dups)
}

// A produce request that fails for good must take the later records of
// its partition with it: if the client writes them, an aggregate's later
// events reach the broker before the failed earlier ones, which the relay
// sends again only afterwards. One hot aggregate, one batch of 1,000, the
// first produce request of the batch fails; a few rounds, because whether
// the batch spans several requests depends on timing.
func TestFailedProduceDoesNotLetLaterEventsOvertake(t *testing.T) {
	t.Parallel()
	const rounds, batch = 3, 1_000
	b := setup(t)
	r := b.relayer(t, func(c *relay.Config) { c.BatchSize = batch })
	b.preload(t, 1, 1, "hot.warmup") // topic metadata loaded: the batches below stream
	run(t, r)
	b.waitDrained(t, 30*time.Second)
	for range rounds {
		f := b.broker.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.CorruptMessage, Count: 1})
		b.preload(t, batch, 1, "hot.added")
		waitHits(t, f, 1)
		b.waitDrained(t, 30*time.Second)
	}
	recs := b.consume(t, rounds*batch, 30*time.Second, "hot")
	checkOrder(t, recs)
}

func waitHits(t *testing.T, h *kfake.FaultHandle, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, h.Wait(ctx, n), "fault hit %d of %d times", h.Hits(), n)
}
