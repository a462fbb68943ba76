package relay_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// recordingHook implements every hook interface and records the calls.
type recordingHook struct {
	mu          sync.Mutex
	calls       *[]string // shared with the other hooks: the order of calls
	batches     []relay.BatchResult
	failures    []relay.PublishFailure
	batchErrors []error
}

func (h *recordingHook) OnBatch(res relay.BatchResult) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.batches = append(h.batches, res)
	*h.calls = append(*h.calls, "recording.OnBatch")
}

func (h *recordingHook) OnPublishFailure(f relay.PublishFailure) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures = append(h.failures, f)
}

func (h *recordingHook) OnBatchError(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.batchErrors = append(h.batchErrors, err)
}

// batchOnlyHook implements BatchHook only; it shares recordingHook's lock.
type batchOnlyHook struct{ r *recordingHook }

func (h batchOnlyHook) OnBatch(relay.BatchResult) {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	*h.r.calls = append(*h.r.calls, "batchOnly.OnBatch")
}

// failingPublisher refuses one row for good and fails another once.
type failingPublisher struct {
	fakesink.Kafka

	inner                relay.Sink
	permanent, transient int64
	mu                   sync.Mutex
	failedOnce           bool
}

func (p *failingPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := p.inner.Publish(ctx, msgs)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range msgs {
		switch {
		case m.ID == p.permanent:
			errs[i] = relay.Permanent(errors.New("the broker refuses this one"))
		case m.ID == p.transient && !p.failedOnce:
			p.failedOnce = true
			errs[i] = errors.New("broker hiccup")
		}
	}
	return errs
}

// Hooks see every batch (with its dispatched rows by topic and its holds),
// every failed row once with whether the relayer refused it itself, and
// every failed batch; a hook that implements only some interfaces gets
// only those calls, in the order of Config.Hooks.
func TestHooksObserveBatchesFailuresAndFailedBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 3 {
		b.emit(t, uuid.New(), "order.placed", map[string]int{"n": 1})
	}
	b.emit(t, uuid.New(), "payment.captured", map[string]int{"n": 1})
	refused := b.db.InsertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'{"retries": 3}'`)
	permanent := b.emit(t, uuid.New(), "order.placed", map[string]int{"n": 2})
	transient := b.emit(t, uuid.New(), "payment.captured", map[string]int{"n": 2})

	var calls []string
	rec := &recordingHook{calls: &calls}
	r := b.relayer(t, func(c *relay.Config) {
		c.Sink = &failingPublisher{inner: c.Sink, permanent: permanent, transient: transient}
		c.Hooks = []relay.Hook{rec, batchOnlyHook{rec}, onBatch(func(relay.BatchResult) {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			calls = append(calls, "onBatch")
		})}
	})
	run(t, r)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		byTopic := map[string]int{}
		for _, res := range rec.batches {
			for topic, n := range res.DispatchedByTopic {
				byTopic[topic] += n
			}
		}
		assert.Equal(c, map[string]int{"order": 3, "payment": 2}, byTopic)
	}, 20*time.Second, 20*time.Millisecond, "hooks did not see every dispatched row by topic")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	st := r.Stats()
	require.Len(t, rec.batches, int(st.Batches))
	dispatched, permanents, transients := 0, 0, 0
	var holds []int64
	for _, res := range rec.batches {
		dispatched += res.Dispatched
		permanents += res.Permanent
		transients += res.Transient
		for _, h := range res.Holds {
			holds = append(holds, h.EventID)
		}
	}
	require.Equal(t, 5, dispatched)
	require.ElementsMatch(t, []int64{refused, permanent}, holds)

	// One call per failure BatchResult counted, each with its row.
	require.Len(t, rec.failures, permanents+transients)
	byID := map[int64]relay.PublishFailure{}
	for _, f := range rec.failures {
		byID[f.Message.ID] = f
	}
	require.True(t, byID[refused].Refused, "the relayer refused the undecodable row itself")
	require.Equal(t, relay.ReasonUndecodable, relay.ReasonOf(byID[refused].Err))
	require.False(t, byID[permanent].Refused)
	require.True(t, relay.IsPermanent(byID[permanent].Err))
	require.Equal(t, "order", byID[permanent].Message.Topic)
	require.False(t, byID[transient].Refused)
	require.False(t, relay.IsPermanent(byID[transient].Err))
	require.ErrorContains(t, byID[transient].Err, "broker hiccup")

	// The transient failure failed its batch, which backed off.
	require.Len(t, rec.batchErrors, int(st.FailedBatches))
	require.NotEmpty(t, rec.batchErrors)
	require.ErrorContains(t, rec.batchErrors[0], "broker hiccup")

	// Every batch reached the three batch observers, in Config order.
	require.Len(t, calls, 3*len(rec.batches))
	for i := 0; i < len(calls); i += 3 {
		require.Equal(t, []string{"recording.OnBatch", "batchOnly.OnBatch", "onBatch"}, calls[i:i+3], fmt.Sprint(calls))
	}
}

// New refuses a nil hook and one that implements no hook interface (a
// Monitor passed instead of its Metrics, say).
func TestNewRefusesHooksThatObserveNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		hook relay.Hook
		err  string
	}{
		{nil, "Config.Hooks[0] is nil"},
		{struct{}{}, "Config.Hooks[0] (struct {}) implements none of BatchHook, PublishFailureHook, BatchErrorHook"},
	} {
		_, err := relay.New(relay.Config{Common: relay.Common{Pool: b.db.Pool, Sink: b.publisher(t), Hooks: []relay.Hook{tc.hook}}})
		require.ErrorContains(t, err, tc.err)
	}
}
