package relay

import "fmt"

// Hook observes a source (either relayer): metrics, tracing, alerting. It is any value
// that implements one or more of BatchHook, PublishFailureHook and
// BatchErrorHook; New finds out which by type assertion, as franz-go's
// kgo.Hook and pgx's tracers do, so a hook implements only what it needs
// and new hook kinds can be added without breaking existing hooks.
//
// A source calls hooks (through its Observer) on one goroutine, one batch
// at a time, in the order of Common.Hooks. Keep them fast: the next batch
// waits.
type Hook any

// BatchHook is called after every batch that claimed rows has committed
// (polling) or after every publish of a batch and the parking of what it
// refused (WAL), whether or not every event went through (a batch with
// transient failures is then also reported to BatchErrorHook).
// BatchResult carries the dispatched events by topic and the holds (for
// the WAL source: the parked events) the batch recorded.
type BatchHook interface {
	OnBatch(BatchResult)
}

// PublishFailureHook is called once per row that failed in a batch and
// counts as a failure in BatchResult (Permanent or Transient): the first
// failed row of its aggregate, not the rows deferred behind it. It is
// called before the batch commits (or its refused events are parked), so
// also for a batch that then fails to commit.
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

// hooks are Common.Hooks sorted by kind.
type hooks struct {
	batch        []BatchHook
	failure      []PublishFailureHook
	batchFailure []BatchErrorHook
}

func sortHooks(hs []Hook) (hooks, error) {
	var h hooks
	for i, hk := range hs {
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
	return h, nil
}
