package relay

import (
	"context"
	"fmt"
)

// PublishLane is Publish for a source with ExactlyOnce: it sends msgs and
// progress in one transaction of lane (Lane.Publish), in the same
// "send <topic>" span(s) as Publish, and returns Lane.Publish's results.
// A transaction of no messages (progress only) gets no span.
func (o *Observer) PublishLane(ctx context.Context, lane Lane, msgs []Message, progress []byte) ([]error, error) {
	if len(msgs) == 0 {
		return lane.Publish(ctx, nil, progress)
	}
	pctx, endSpan := o.tracing.startPublish(ctx, msgs)
	errs, err := lane.Publish(pctx, msgs, progress)
	if err == nil && len(errs) != len(msgs) {
		err = fmt.Errorf("lane returned %d results for %d messages: the transaction's outcome is unknown", len(errs), len(msgs))
	}
	endSpan(errs, err)
	return errs, err
}

// Lane reports what happened to a lane to every LaneHook.
func (o *Observer) Lane(ev LaneEvent) {
	for _, l := range o.hooks.lane {
		l.OnLane(ev)
	}
}
