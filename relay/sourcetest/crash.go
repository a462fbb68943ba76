package sourcetest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// crashingPublisher publishes through its Sink and, in the first call that
// comes once crashAfter events were acknowledged by the broker, lets crash
// run after the broker acknowledged and before the relayer can acknowledge
// the events to the outbox: the window a process crash would hit. That
// call first waits pause, so that a source acknowledging at intervals has
// told the outbox about the earlier calls.
type crashingPublisher struct {
	relay.Sink // publishes
	crashAfter int
	pause      time.Duration
	crash      func()
	crashed    chan struct{}

	mu        sync.Mutex
	calls     int
	crashCall int            // the call that crashed, from 1; 0 before
	published map[int64]bool // every event the broker acknowledged
	inCrash   []int64        // the events of the call that crashed
}

func (p *crashingPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	p.mu.Lock()
	p.calls++
	crashing := p.crashCall == 0 && len(p.published) >= p.crashAfter
	if crashing {
		p.crashCall = p.calls
	}
	p.mu.Unlock()
	if crashing {
		time.Sleep(p.pause)
	}
	errs := p.Sink.Publish(ctx, msgs)
	p.mu.Lock()
	for i, m := range msgs {
		if errs[i] == nil {
			p.published[m.ID] = true
			if crashing {
				p.inCrash = append(p.inCrash, m.ID)
			}
		}
	}
	p.mu.Unlock()
	if crashing {
		p.crash()
		close(p.crashed)
	}
	return errs
}

// CrashBetweenPublishAndAck: a relayer dies after the broker acknowledged
// a batch and before it acknowledged the batch to the outbox (the marking
// commit; the slot's confirmed position): its database sessions are
// killed and its process stops. The batch is still to be published, and a
// fresh relayer sends exactly what the outbox had not been told, again:
// every event arrives at least once, the events delivered twice are
// exactly those the first relayer published and the outbox had not
// acknowledged, and the first delivery of each event still follows
// per-aggregate order.
func CrashBetweenPublishAndAck(t *testing.T, src Source) {
	const events, aggregates, batch = 3_000, 40, 200
	e := open(t, src)
	committed := e.emitSpread(t, events, aggregates, "order.placed")

	var r1 *Relayer
	started := make(chan struct{})
	// The crash comes once two batches' worth of events went out, after
	// a pause longer than any source's interval between acknowledgements
	// (the WAL source's StatusInterval in its tests is 200ms).
	pub := &crashingPublisher{Sink: e.publisher(t, kafkapub.PublisherConfig{}), crashAfter: 2 * batch, pause: 600 * time.Millisecond,
		crashed: make(chan struct{}), published: map[int64]bool{}, crash: func() { <-started; r1.Kill() }}
	r1 = src.Start(t, e.db, pub, RelayerConfig{BatchSize: batch})
	close(started)
	select {
	case <-pub.crashed:
	case <-time.After(30 * time.Second):
		t.Fatal("the first relayer did not reach its crash within 30s")
	}
	r1.Stop() // waits for its Run to return nil: a killed relayer's Run still returns nil on cancel
	pub.mu.Lock()
	inCrash, published, crashCall := pub.inCrash, pub.published, pub.crashCall
	pub.mu.Unlock()
	require.NotEmpty(t, inCrash, "the broker acknowledged the crashed batch")

	unacked := src.Unacked(t, e.db)
	for _, id := range inCrash {
		require.True(t, contains(unacked, id), "%s: event %d of the crashed batch was acknowledged to the outbox, yet the crash came first", src.Name, id)
	}
	var resend []int64 // published, and still to be published: sent twice
	for _, id := range unacked {
		if published[id] {
			resend = append(resend, id)
		}
	}
	if src.AcksEachBatch {
		slices.Sort(inCrash)
		require.Equal(t, inCrash, resend, "%s: only the crashed batch may be left unacknowledged", src.Name)
	}

	run2 := src.Start(t, e.db, e.publisher(t, kafkapub.PublisherConfig{}), RelayerConfig{BatchSize: batch})
	recs := e.consume(t, events+len(resend), 30*time.Second, "order")
	dups := e.checkDelivered(t, committed, recs)
	t.Logf("%s: %d events, crash in publish %d (%d events); %d published by then, %d of them unacknowledged; %d records, %d duplicates",
		src.Name, events, crashCall, len(inCrash), len(published), len(resend), len(recs), total(dups))
	want := map[int64]int{}
	for _, id := range resend {
		want[id] = 1
	}
	require.Equal(t, want, dups, "%s: exactly the published and unacknowledged events are delivered twice", src.Name)
	run2.Stop()
	require.Empty(t, src.Unacked(t, e.db), "%s: events left to publish after a graceful stop", src.Name)
}

// gatedPublisher lets a scenario change the broker's faults between
// publishes, never while one is under way.
type gatedPublisher struct {
	relay.Sink
	mu sync.Mutex
}

func (p *gatedPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.Sink.Publish(ctx, msgs)
}

// between runs fn while no publish is under way.
func (p *gatedPublisher) between(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn()
}

// BrokerFaults: broker failures mid-run, while writers keep committing:
// first retriable errors, which the client retries inside one publish;
// then an outage in which every produce request fails with an error the
// client does not retry, so whole publishes fail and are retried with
// backoff until the broker recovers. Nothing is lost and per-aggregate
// order holds.
func BrokerFaults(t *testing.T, src Source) {
	const events, aggregates, writers = 4_000, 40, 4
	e := open(t, src)
	// A retriable error sends the client to refresh its metadata, at most
	// once per MetadataMinAge (5s by default, as long as the delivery
	// timeout): keep it short so retries succeed within a publish.
	gate := &gatedPublisher{Sink: e.publisher(t, kafkapub.PublisherConfig{}, kgo.MetadataMinAge(100*time.Millisecond))}
	r := src.Start(t, e.db, gate, RelayerConfig{BatchSize: 200})

	var committed map[int64]event
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		committed = e.writeLoad(t, events, aggregates, writers, "order.placed")
	}()
	require.Eventually(t, func() bool { return r.Stats().Published > 300 }, 30*time.Second, 5*time.Millisecond)
	var retriable, outage *kfake.FaultHandle
	gate.between(func() {
		retriable = e.broker.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: 2})
	})
	waitHits(t, retriable, 2)
	failedBefore := r.Stats().FailedBatches
	gate.between(func() {
		// CORRUPT_MESSAGE: the client does not retry it; the records fail.
		outage = e.broker.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.CorruptMessage, Count: -1})
	})
	require.Eventually(t, func() bool { return r.Stats().FailedBatches >= failedBefore+3 }, 30*time.Second, 5*time.Millisecond,
		"the outage should fail publishes")
	gate.between(outage.Remove)
	select {
	case <-wrote:
	case <-time.After(240 * time.Second):
		t.Fatal("writers did not finish within 240s")
	}
	require.Equal(t, events, len(committed), "committed events")

	recs := e.consume(t, events, 60*time.Second, "order")
	dups := e.checkDelivered(t, committed, recs)
	s := r.Stats()
	t.Logf("%s: %d events; %d retriable faults, %d failed produce requests in the outage; %d published, %d failed batches (%d in the outage); %d records, %d duplicates",
		src.Name, events, retriable.Hits(), outage.Hits(), s.Published, s.FailedBatches, s.FailedBatches-failedBefore, len(recs), total(dups))
	r.Stop()
	require.Empty(t, src.Unacked(t, e.db), "%s: events left to publish after a graceful stop", src.Name)
}

// FailedProduceNoOvertake: a produce request that fails for good must take
// the later records of its partition with it: if the client writes them,
// an aggregate's later events reach the broker before the failed earlier
// ones, which the relayer sends again only afterwards. One hot aggregate,
// publishes of up to 1,000, the first produce request after each burst of
// 1,000 fails; a few rounds, because whether a publish spans several
// requests depends on timing.
func FailedProduceNoOvertake(t *testing.T, src Source) {
	const rounds, batch = 3, 1_000
	e := open(t, src)
	committed := e.preload(t, 1, 1, "hot.warmup") // topic metadata loaded: the bursts below stream
	r := src.Start(t, e.db, e.publisher(t, kafkapub.PublisherConfig{}), RelayerConfig{BatchSize: batch})
	e.consume(t, 1, 30*time.Second, "hot")
	for i := range rounds {
		f := e.broker.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.CorruptMessage, Count: 1})
		for id, ev := range e.preload(t, batch, 1, "hot.added") {
			committed[id] = ev
		}
		waitHits(t, f, 1)
		e.consume(t, 1+(i+1)*batch, 30*time.Second, "hot")
	}
	recs := e.consume(t, len(committed), 30*time.Second, "hot")
	dups := e.checkDelivered(t, committed, recs)
	t.Logf("%s: %d events in %d bursts, one failed produce request each: %d records, %d duplicates", src.Name, len(committed), rounds, len(recs), total(dups))
	r.Stop()
	require.Empty(t, src.Unacked(t, e.db), "%s: events left to publish after a graceful stop", src.Name)
}

// StopWhileStarting: a relayer stopped at any moment, even before it got
// going (while it connects and checks the outbox's schema), returns nil
// from Run: a stop is not a failure, and whatever runs the relayer
// (`outbox relay`, a test, a supervisor) must not see one. Then the
// outbox still relays.
func StopWhileStarting(t *testing.T, src Source) {
	e := open(t, src)
	for _, after := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond} {
		r := src.Start(t, e.db, e.publisher(t, kafkapub.PublisherConfig{}), RelayerConfig{})
		time.Sleep(after)
		require.NoError(t, r.stop(), "%s: stopped %s after it started", src.Name, after)
	}
	committed := e.preload(t, 10, 3, "order.placed")
	r := src.Start(t, e.db, e.publisher(t, kafkapub.PublisherConfig{}), RelayerConfig{})
	e.checkDelivered(t, committed, e.consume(t, len(committed), 30*time.Second, "order"))
	r.Stop()
}

func waitHits(t *testing.T, h *kfake.FaultHandle, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, h.Wait(ctx, n), "fault hit %d of %d times", h.Hits(), n)
}

func contains(sorted []int64, id int64) bool {
	_, ok := slices.BinarySearch(sorted, id)
	return ok
}
