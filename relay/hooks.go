package relay

import "fmt"

// Hook observes a source (either relayer): metrics, tracing, alerting. It is any value
// that implements one or more of BatchHook, PublishFailureHook,
// BatchErrorHook and LaneHook; New finds out which by type assertion, as franz-go's
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

// LaneHook is called, with Common.ExactlyOnce, on what happens to the
// source's lanes (see LaneEvent): a relayer opened one, skipped events a
// lane held already, had a broker transaction aborted, or lost its lane
// to another relayer. It may be called from another goroutine than the
// other hooks: keep it safe for concurrent use.
type LaneHook interface {
	OnLane(LaneEvent)
}

// LaneEventKind says what happened to a lane.
type LaneEventKind string

const (
	// LaneOpened: the relayer took a lane and opened it, which fences
	// every earlier holder. With the polling source, Published and
	// Returned count the rows of the batch the lane was left in flight
	// with: found in a committed transaction (they stay dispatched), or
	// not (back to pending).
	LaneOpened LaneEventKind = "opened"
	// LaneSkipped (WAL source): Skipped events read again from the slot
	// were in a transaction the lane committed already, and were not
	// published again. Reported once the stream has read past them.
	LaneSkipped LaneEventKind = "skipped"
	// LaneAborted: a broker transaction was aborted (a record refused, a
	// timeout); its batch is settled as failed and retried.
	LaneAborted LaneEventKind = "aborted"
	// LaneLost: another relayer took the lane (the broker fenced this one,
	// or its lease was taken); this relayer stepped down, and nothing it
	// had in flight becomes visible.
	LaneLost LaneEventKind = "lost"
)

// LaneEvent is one thing that happened to a lane.
type LaneEvent struct {
	Kind LaneEventKind
	// Lane is the lane's transactional id (Common.LaneID).
	Lane string
	// Published, Returned (LaneOpened) and Skipped (LaneSkipped) count
	// events; see the kinds.
	Published, Returned, Skipped int64
	// Err is the error that aborted the transaction or lost the lane.
	Err error
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
	lane         []LaneHook
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
		if l, ok := hk.(LaneHook); ok {
			h.lane, known = append(h.lane, l), true
		}
		if !known {
			return hooks{}, fmt.Errorf("relay: Config.Hooks[%d] (%T) implements none of BatchHook, PublishFailureHook, BatchErrorHook, LaneHook; pass a value that does (for ops metrics, Monitor.Metrics())", i, hk)
		}
	}
	return h, nil
}
