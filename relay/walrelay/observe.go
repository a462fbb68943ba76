package walrelay

import (
	"context"
	"time"

	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/relay"
)

// The WAL source reports to Config.Hooks and traces through the
// relay.Observer both sources share. A batch, as the hooks see it, is
// one Publish call of settle: a batch that is retried after a transient
// failure is reported once per try, as the polling relay reports each
// claim.

// publish sends one try of a batch through the Observer (in its "send
// <topic>" spans) and returns one error per message: a Sink that
// answered with the wrong number of results fails them all, transiently.
func (r *Relayer) publish(ctx context.Context, send []relay.Message) []error {
	if len(send) == 0 {
		return nil
	}
	errs, err := r.obs.Publish(ctx, send)
	if err != nil {
		errs = make([]error, len(send))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// observe reports one try of a batch to the hooks: n items, of which send
// went to the Sink with results errs, park were refused for good
// (before sending, or by the broker) and notParked of those could not be
// parked yet (they go round again). Every failure is a PublishFailure;
// the parked are the BatchResult's Holds (Until zero: parked, not held).
func (r *Relayer) observe(start time.Time, n int, send []relay.Message, errs []error, park, notParked []item) {
	ackedAt := time.Now()
	watched := r.obs.Watched()
	res := relay.BatchResult{Locked: n, Claimed: n}
	parked, retried := ids(park), ids(notParked)
	var sent map[int64]bool
	if len(park) > 0 {
		sent = make(map[int64]bool, len(send))
	}
	for j, m := range send {
		if sent != nil {
			sent[m.ID] = true
		}
		if errs[j] == nil {
			res.Dispatched++
			if !watched {
				continue // no hook reads the per-event parts
			}
			if res.DispatchedByTopic == nil {
				res.DispatchedByTopic = map[string]int{}
			}
			res.DispatchedByTopic[m.Topic]++
			if !m.CreatedAt.IsZero() {
				res.Latencies = append(res.Latencies, ackedAt.Sub(m.CreatedAt))
			}
			continue
		}
		if parked[m.ID] {
			continue // reported with park
		}
		res.Transient++
		r.obs.PublishFailure(relay.PublishFailure{Message: m, Err: errs[j]})
	}
	for _, it := range park {
		r.obs.PublishFailure(relay.PublishFailure{Message: it.msg, Err: it.err, Refused: !sent[it.msg.ID]})
		if retried[it.msg.ID] {
			continue
		}
		res.Permanent++
		reason := relay.ReasonOf(it.err)
		if reason == "" {
			reason = relay.ReasonBrokerRefused
		}
		res.Holds = append(res.Holds, relay.Hold{
			EventID: it.msg.ID, AggregateID: it.msg.AggregateID, Type: it.msg.Type,
			Reason: reason, Err: clip.Text(it.err.Error(), 2000), Attempts: 1,
		})
	}
	res.Duration = time.Since(start)
	r.claimed.Add(int64(n))
	r.permanent.Add(int64(res.Permanent))
	r.transient.Add(int64(res.Transient))
	r.obs.Batch(res)
}

// ids are the event ids of items; nil for none.
func ids(items []item) map[int64]bool {
	if len(items) == 0 {
		return nil
	}
	m := make(map[int64]bool, len(items))
	for _, it := range items {
		m[it.msg.ID] = true
	}
	return m
}
