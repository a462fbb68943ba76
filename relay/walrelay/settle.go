package walrelay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/clip"
	"github.com/pgoutbox/outbox/relay"
)

// settle publishes items until each is acknowledged or parked: a record
// the broker refuses for good (or the relayer cannot decode) is moved to
// the parked table and the stream goes on without it; anything else is
// retried, in order, with backoff, for as long as it takes (or until ctx
// ends). Publish never acknowledges a record of an aggregate ahead of an
// earlier one that failed, so retrying the unacknowledged ones in order
// keeps each aggregate's order, but for the parked.
//
// A topic the broker does not know (ReasonInvalidTopic from the
// publisher; a type that makes no valid topic name is refused before, in
// decode) is retried for UnknownTopicGrace, then parked: the topic may be
// about to be created.
//
// Once runCtx ends (Run is stopping), the publish under way is let
// finish, but a failed one is not retried: the next leader re-sends it.
//
// First each item is checked against its contract (checkContracts): one
// that breaks it is parked in the first round.
//
// It reports whether every item was settled.
func (r *Relayer) settle(ctx, runCtx context.Context, items []item) bool {
	r.checkContracts(items)
	// Backoff sleeps end with the stop too.
	sleepCtx, stopSleep := context.WithCancel(ctx)
	defer stopSleep()
	defer context.AfterFunc(runCtx, stopSleep)()
	failures := 0
	var unknownSince map[int64]time.Time
	for len(items) > 0 && ctx.Err() == nil {
		var transient error
		items, transient = r.publishRound(ctx, items, &unknownSince)
		if transient == nil {
			failures = 0
			continue
		}
		if ctx.Err() != nil || runCtx.Err() != nil {
			return false // shutting down: not a failure
		}
		failures++
		r.failedBatches.Add(1)
		r.obs.BatchError(transient)
		d := backoff.Delay(r.cfg.BackoffMin, r.cfg.BackoffMax, failures)
		r.log.Warn("wal relay publish failed; retrying the unacknowledged events in order", "err", transient, "events", len(items), "attempt", failures, "retry_in", d.Round(time.Millisecond))
		if !backoff.Sleep(sleepCtx, d) {
			return false
		}
	}
	if len(items) > 0 {
		return false
	}
	r.batches.Add(1)
	return true
}

// settleInline is one round of settle, within inlineBound, on the
// stream goroutine (streamer.send): it returns the items left to settle,
// in order (none: every item was acknowledged or parked). A round cut
// short by the bound fails its unacknowledged items, which settle then
// sends again: at least once, in order, as after any transient failure.
func (r *Relayer) settleInline(ctx context.Context, items []item) []item {
	r.checkContracts(items)
	bctx, cancel := context.WithTimeout(ctx, r.inlineBound)
	defer cancel()
	var unknownSince map[int64]time.Time
	rest, _ := r.publishRound(bctx, items, &unknownSince)
	if len(rest) == 0 {
		r.batches.Add(1)
	}
	return rest
}

// publishRound publishes items once and parks those refused for good (or
// not decoded). It returns the items left to publish, in their order, and
// the error to back off for before the next round (nil: go on at once).
func (r *Relayer) publishRound(ctx context.Context, items []item, unknownSince *map[int64]time.Time) ([]item, error) {
	start := time.Now()
	var park []item
	send := make([]relay.Message, 0, len(items))
	sendIdx := make([]int, 0, len(items))
	for i := range items {
		if items[i].err != nil {
			park = append(park, items[i])
			continue
		}
		send = append(send, items[i].msg)
		sendIdx = append(sendIdx, i)
	}
	errs := r.publish(ctx, send)
	var (
		again     []item
		ok        int64
		refused   map[uuid.UUID]bool
		transient error
	)
	for j, i := range sendIdx {
		switch err := errs[j]; {
		case err == nil:
			ok++
		case relay.ReasonOf(err) == relay.ReasonInvalidTopic && r.withinGrace(unknownSince, items[i].msg.ID):
			again = append(again, items[i])
			if transient == nil && !refused[items[i].msg.AggregateID] {
				transient = fmt.Errorf("topic %s unknown to the broker, retried for up to %s before the event is parked: %w", items[i].msg.Topic, r.cfg.UnknownTopicGrace, err)
			}
		case relay.IsPermanent(err):
			it := items[i]
			it.err = err
			park = append(park, it)
			if refused == nil {
				refused = map[uuid.UUID]bool{}
			}
			refused[it.msg.AggregateID] = true
		default:
			again = append(again, items[i])
			if transient == nil && !refused[items[i].msg.AggregateID] {
				transient = err
			}
		}
	}
	r.published.Add(ok)
	var notParked []item
	if len(park) > 0 {
		if rest, err := r.parkOrDrop(ctx, park); err != nil {
			notParked = rest
			// Not parked: they go round again, in their place.
			again = mergeInOrder(items, again, rest)
			if transient == nil {
				transient = err
			}
		}
	}
	r.observe(start, len(items), send, errs, park, notParked)
	return again, transient
}

// withinGrace reports whether the event id, whose topic the broker does
// not know, is still within UnknownTopicGrace of its first such refusal.
func (r *Relayer) withinGrace(since *map[int64]time.Time, id int64) bool {
	if *since == nil {
		*since = map[int64]time.Time{}
	}
	first, ok := (*since)[id]
	if !ok {
		(*since)[id] = time.Now()
		return true
	}
	return time.Since(first) < r.cfg.UnknownTopicGrace
}

// parkOrDrop parks items; when the parked table refuses one with a data
// error (SQLSTATE class 22, e.g. a \u0000 in its JSON), retrying cannot
// help and would hold the stream forever: that one is dropped, logged
// with what identifies it. It returns the items neither parked nor
// dropped, with the error that stopped it.
func (r *Relayer) parkOrDrop(ctx context.Context, items []item) ([]item, error) {
	err := r.park(ctx, items)
	if err == nil {
		return nil, nil
	}
	if !isDataError(err) {
		return items, err
	}
	for i, it := range items {
		err := r.park(ctx, []item{it})
		if err == nil {
			continue
		}
		if !isDataError(err) {
			return items[i:], err
		}
		r.dropped.Add(1)
		r.log.Error("event dropped: it can be neither published nor parked (the parked table refuses it); in plain-insert mode its row stays in the outbox, fix it there and re-insert it to publish it",
			"event_id", it.msg.ID, "aggregate_id", it.msg.AggregateID, "type", clip.Text(it.msg.Type, 200), "reason", relay.ReasonOf(it.err), "publish_err", it.err, "park_err", err)
	}
	return nil, nil
}

// isDataError reports a Postgres data exception (SQLSTATE class 22): the
// values are wrong, the same statement fails again.
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// mergeInOrder returns the items of a and b in their order in all.
func mergeInOrder(all, a, b []item) []item {
	in := make(map[int64]bool, len(a)+len(b))
	for _, it := range a {
		in[it.msg.ID] = true
	}
	for _, it := range b {
		in[it.msg.ID] = true
	}
	out := make([]item, 0, len(a)+len(b))
	for _, it := range all {
		if in[it.msg.ID] {
			out = append(out, it)
		}
	}
	return out
}

// park moves items to the parked table in one transaction, logging each.
func (r *Relayer) park(ctx context.Context, items []item) error {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("park %d events: %w", len(items), err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	for _, it := range items {
		reason := relay.ReasonOf(it.err)
		if reason == "" {
			reason = relay.ReasonBrokerRefused
		}
		why := "wal relay: " + reason
		msg := clip.Text(it.err.Error(), 2000)
		var headers *string
		if it.rawHeaders != nil {
			h := string(it.rawHeaders)
			headers = &h
		}
		created := it.msg.CreatedAt
		if created.IsZero() {
			created = time.Now()
		}
		// JSON payload and headers are kept as they are; anything else as
		// JSON strings (parkRawSQL), so that the parked row is whole.
		sql := r.parkSQL
		args := []any{it.msg.ID, it.msg.AggregateID, it.msg.Type, string(it.msg.Payload), headers, created, why, msg}
		switch {
		case it.msg.ContentType != "":
			// A binary payload: kept as bytes, with its content type.
			sql, args[3] = r.parkBinSQL, it.msg.Payload
			if headers != nil && !json.Valid(it.rawHeaders) {
				h, _ := json.Marshal(*headers)
				args[4] = string(h)
			}
			args = append(args, it.msg.ContentType)
		case !json.Valid(it.msg.Payload) || (headers != nil && !json.Valid(it.rawHeaders)):
			sql = r.parkRawSQL
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("park event %d: %w", it.msg.ID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("park %d events: %w", len(items), err)
	}
	for _, it := range items {
		r.parked.Add(1)
		r.log.Error("event parked: it cannot be published, so the stream goes on without it; later events of its aggregate are published without it",
			"event_id", it.msg.ID, "aggregate_id", it.msg.AggregateID, "type", clip.Text(it.msg.Type, 200), "reason", relay.ReasonOf(it.err), "err", it.err,
			"unpark", fmt.Sprintf("outbox events unpark %d --yes", it.msg.ID))
	}
	return nil
}

// checkContracts checks the items not refused yet against their contracts
// (Common.Contracts) as the polling relay checks its batches
// (relay.CheckContracts, spread over GOMAXPROCS goroutines for a large
// batch): here, on the goroutine that publishes, rather than on the one
// that reads the stream, so that a batch's checks run in parallel. An item
// that breaks its contract fails for good (ReasonContract); one that
// passes without an event_version header gets one.
func (r *Relayer) checkContracts(items []item) {
	if r.cfg.Contracts == nil {
		return
	}
	msgs := make([]relay.Message, len(items))
	refuse := make([]error, len(items))
	for i := range items {
		msgs[i], refuse[i] = items[i].msg, items[i].err
	}
	relay.CheckContracts(r.cfg.Contracts, msgs, refuse)
	for i := range items {
		items[i].msg.Headers, items[i].err = msgs[i].Headers, refuse[i]
	}
}
