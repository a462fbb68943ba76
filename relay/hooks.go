package relay

import "fmt"

// Hook observes a relayer: metrics, tracing, alerting. It is any value
// that implements one or more of BatchHook, PublishFailureHook and
// BatchErrorHook; New finds out which by type assertion, as franz-go's
// kgo.Hook and pgx's tracers do, so a hook implements only what it needs
// and new hook kinds can be added without breaking existing hooks.
//
// The relayer calls hooks on its own goroutine, one batch at a time, in
// the order of Config.Hooks. Keep them fast: the next batch waits.
type Hook any

// BatchHook is called after every batch that claimed rows has committed,
// whether or not every row went through (a batch with transient failures
// is then also reported to BatchErrorHook). BatchResult carries the
// dispatched rows by topic and the holds the batch recorded.
type BatchHook interface {
	OnBatch(BatchResult)
}

// PublishFailureHook is called once per row that failed in a batch and
// counts as a failure in BatchResult (Permanent or Transient): the first
// failed row of its aggregate, not the rows deferred behind it. It is
// called before the batch commits, so also for a batch that then fails to
// commit.
type PublishFailureHook interface {
	OnPublishFailure(PublishFailure)
}

// BatchErrorHook is called when a batch fails and the relayer backs off
// before the next: the database or the broker is unreachable, or some rows
// failed transiently. Shutdown is not a failure and is not reported.
type BatchErrorHook interface {
	OnBatchError(error)
}

// PublishFailure is one row that could not be published.
type PublishFailure struct {
	// Message is the row. Its Payload is shared with the relayer: read it
	// during the call only.
	Message Message
	// Err is the row's error; IsPermanent and ReasonOf classify it.
	Err error
	// Refused is true when the relayer refused the row itself, before it
	// reached the Sink: headers it cannot decode, a type routing to no
	// valid topic. Err is then permanent.
	Refused bool
	// Code is the sink's name for Err (Sink.ErrorCode), for metrics; ""
	// when Refused.
	Code string
}

// hooks are Config.Hooks (and Config.OnBatch) sorted by kind at New.
type hooks struct {
	batch        []BatchHook
	failure      []PublishFailureHook
	batchFailure []BatchErrorHook
}

// onBatchFunc makes Config.OnBatch a BatchHook.
type onBatchFunc func(BatchResult)

func (f onBatchFunc) OnBatch(res BatchResult) { f(res) }

func newHooks(cfg Config) (hooks, error) {
	var h hooks
	for i, hk := range cfg.Hooks {
		if hk == nil {
			return hooks{}, fmt.Errorf("relay: Config.Hooks[%d] is nil; remove it", i)
		}
		known := false
		if b, ok := hk.(BatchHook); ok {
			h.batch, known = append(h.batch, b), true
		}
		if f, ok := hk.(PublishFailureHook); ok {
			h.failure, known = append(h.failure, f), true
		}
		if e, ok := hk.(BatchErrorHook); ok {
			h.batchFailure, known = append(h.batchFailure, e), true
		}
		if !known {
			return hooks{}, fmt.Errorf("relay: Config.Hooks[%d] (%T) implements none of BatchHook, PublishFailureHook, BatchErrorHook; pass a value that does (for ops metrics, Monitor.Metrics())", i, hk)
		}
	}
	if cfg.OnBatch != nil {
		h.batch = append(h.batch, onBatchFunc(cfg.OnBatch))
	}
	return h, nil
}

func (h *hooks) onBatch(res BatchResult) {
	for _, b := range h.batch {
		b.OnBatch(res)
	}
}

// onFailures reports the rows of c that settle counted as failures, by
// index, with sink's code for each error.
func (h *hooks) onFailures(sink Sink, c *claimed, errs []error, failed []int) {
	for _, i := range failed {
		f := PublishFailure{Message: c.msgs[i], Err: errs[i], Refused: c.refused[c.msgs[i].ID]}
		if !f.Refused {
			f.Code = sink.ErrorCode(f.Err)
		}
		for _, hk := range h.failure {
			hk.OnPublishFailure(f)
		}
	}
}

func (h *hooks) onBatchError(err error) {
	for _, e := range h.batchFailure {
		e.OnBatchError(err)
	}
}
