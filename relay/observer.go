package relay

import (
	"context"
	"fmt"
)

// Observer is the part of the source seam that reports what a source does:
// it sends a source's batches to Common.Sink inside the source's
// "send <topic>" spans, and calls Common.Hooks. Both relayers use one, so
// that hooks (monitor.Metrics) and traces see the same things whichever source
// runs; a new source builds one with NewObserver and calls it from the
// goroutine that publishes, one batch at a time:
//
//	errs, err := obs.Publish(ctx, msgs) // one error per message, or err for the call
//	for _, f := range failures { obs.PublishFailure(f) } // the events that count as failed
//	obs.Batch(res)                      // once the batch is settled (committed, parked)
//	obs.BatchError(err)                 // when the source backs off
type Observer struct {
	hooks   hooks
	tracing tracing
	pub     Sink
}

// NewObserver makes the Observer of a source configured with c (defaults
// applied). It fails only when a hook is nil or of no known kind.
func NewObserver(c Common) (*Observer, error) {
	c = c.WithDefaults()
	h, err := sortHooks(c.Hooks)
	if err != nil {
		return nil, err
	}
	return &Observer{hooks: h, tracing: newTracing(c), pub: c.Sink}, nil
}

// Publish sends msgs (their Topic set) to the Sink in the producer
// span(s) of one batch, linked to each message's Emit span through the
// trace context its Headers carry, and records the results on the spans.
// It returns one error per message, or an error for the whole call when
// the Sink answered with the wrong number of results.
func (o *Observer) Publish(ctx context.Context, msgs []Message) ([]error, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	pctx, endSpan := o.tracing.startPublish(ctx, msgs)
	errs := o.pub.Publish(pctx, msgs)
	if len(errs) != len(msgs) {
		err := fmt.Errorf("publisher returned %d results for %d messages", len(errs), len(msgs))
		endSpan(nil, err)
		return nil, err
	}
	endSpan(errs, nil)
	return errs, nil
}

// Watched reports whether any BatchHook listens: a source may skip the
// per-event parts of a BatchResult (Latencies, DispatchedByTopic) when
// none does.
func (o *Observer) Watched() bool { return len(o.hooks.batch) > 0 }

// Batch reports a settled batch to every BatchHook.
func (o *Observer) Batch(res BatchResult) {
	for _, b := range o.hooks.batch {
		b.OnBatch(res)
	}
}

// PublishFailure reports one failed event to every PublishFailureHook,
// with the Sink's code for its error (Sink.ErrorCode) unless the source
// refused it itself or set Code.
func (o *Observer) PublishFailure(f PublishFailure) {
	if !f.Refused && f.Code == "" {
		f.Code = o.pub.ErrorCode(f.Err)
	}
	for _, hk := range o.hooks.failure {
		hk.OnPublishFailure(f)
	}
}

// BatchError reports a failed batch, after which the source backs off, to
// every BatchErrorHook. A stop is not a failure: do not report it.
func (o *Observer) BatchError(err error) {
	for _, e := range o.hooks.batchFailure {
		e.OnBatchError(err)
	}
}
