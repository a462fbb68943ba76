package sinktest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/relay"
)

func aggregates(n int) []uuid.UUID {
	out := make([]uuid.UUID, n)
	for i := range out {
		out[i] = uuid.New()
	}
	return out
}

// padded returns a JSON object payload of exactly n bytes (n >= 11).
func padded(n int) string {
	const head, tail = `{"pad": "`, `"}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// delivers: messages of several aggregates to two destinations, in
// several calls, are all acknowledged and all reach their destination,
// each aggregate's in order; an empty call returns no error.
func delivers(t *testing.T, h Harness) {
	r := start(t, h)
	x, y := r.dest("x"), r.dest("y")
	aggs := aggregates(4)
	var toX, toY []relay.Message
	for call := range 3 {
		var batch []relay.Message
		for i := range 12 {
			agg := aggs[(call+i)%len(aggs)]
			dest := x
			if agg == aggs[2] || agg == aggs[3] {
				dest = y
			}
			m := r.msg(dest, agg, "", map[string]string{"call": fmt.Sprint(call)})
			batch = append(batch, m)
			if dest == x {
				toX = append(toX, m)
			} else {
				toY = append(toY, m)
			}
		}
		for i, err := range r.publish(batch) {
			r.ok(batch[i], err, "no fault was injected")
		}
	}
	if errs := r.publish(nil); len(errs) != 0 {
		t.Errorf("sinktest: %s: Publish of no messages returned %d errors", r.name, len(errs))
	}
	r.check(x, toX)
	r.check(y, toY)
}

// payloadAndHeadersExact: payloads and headers reach the destination byte
// for byte: non-ASCII text, characters an HTML-safe encoder escapes, the
// spacing Postgres writes jsonb in, an empty object, no headers, an empty
// header value, and many headers on one message.
func payloadAndHeadersExact(t *testing.T, h Harness) {
	r := start(t, h)
	x := r.dest("x")
	agg := uuid.New()
	many := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "congo=t61rcWkgMzE"}
	for i := range 64 {
		many[fmt.Sprintf("h-%02d", i)] = fmt.Sprintf("value %d: Grüße, 東京, 🚀 %s", i, strings.Repeat("v", i*8))
	}
	many["empty"] = ""
	payloads := []struct {
		payload string
		headers map[string]string
	}{
		{`{}`, nil},
		{`{"name": "Zoë — 東京 🚀", "html": "<b>a & b</b>", "esc": "quote \" backslash \\ control \u0001 tab \t"}`, map[string]string{}},
		{`{"a": 1, "b": [1, 2, {"c": null}], "d": 1.50, "e": {"f": true}}`, map[string]string{"only": "one"}},
		{`{"text": "` + strings.Repeat("ünïcödé ", 800) + `"}`, many},
		{`{"nested": {"deeper": {"deepest": [[], {}, ""]}}}`, map[string]string{"ключ": "значение", "space in name": " padded "}},
	}
	var batch []relay.Message
	for _, p := range payloads {
		batch = append(batch, r.msg(x, agg, p.payload, p.headers))
	}
	for i, err := range r.publish(batch) {
		r.ok(batch[i], err, "no fault was injected")
	}
	r.check(x, batch)
}

// transientMessageFailure: one message fails with an error a retry may
// fix; it is not permanent, its aggregate's later messages are not
// acknowledged ahead of it, and once the fault heals, sending the
// unacknowledged messages again delivers everything, each aggregate in
// order.
func transientMessageFailure(t *testing.T, h Harness) {
	r := start(t, h)
	r.need(r.sink.FailMessage != nil, "FailMessage", "a transient failure of one message")
	x := r.dest("x")
	aggs := aggregates(4)
	var batch []relay.Message
	for i := range 16 {
		batch = append(batch, r.msg(x, aggs[i%4], "", nil))
	}
	failing := batch[4] // aggs[0]'s second message
	heal := r.sink.FailMessage(t, x, failing.ID)
	errs := r.publish(batch)
	r.retriable(failing, errs[4], "the sink was set to fail it, for now")
	for _, i := range []int{8, 12} {
		r.retriable(batch[i], errs[i], fmt.Sprintf("it comes after message %d of its aggregate, which failed", failing.ID))
	}
	heal()
	r.publishAll(unacked(batch, errs))
	r.check(x, batch)
}

// transientDestinationFailure: a destination fails with an error a retry
// may fix; its messages fail, none permanently, while the messages to
// another destination in the same call are acknowledged; once it heals,
// sending again delivers everything in order.
func transientDestinationFailure(t *testing.T, h Harness) {
	r := start(t, h)
	r.need(r.sink.FailDestination != nil, "FailDestination", "a transient failure of one destination")
	x, y := r.dest("x"), r.dest("y")
	a, b := uuid.New(), uuid.New()
	var batch, toX, toY []relay.Message
	for range 5 {
		mx, my := r.msg(x, a, "", nil), r.msg(y, b, "", nil)
		batch = append(batch, mx, my)
		toX, toY = append(toX, mx), append(toY, my)
	}
	heal := r.sink.FailDestination(t, x)
	errs := r.publish(batch)
	for i, m := range batch {
		if m.Topic == x {
			r.retriable(m, errs[i], "its destination was set to fail, for now")
		} else {
			r.ok(m, errs[i], "only another destination was failing: a destination's failure belongs to it")
		}
	}
	heal()
	r.publishAll(toX)
	r.check(x, toX)
	r.check(y, toY)
}

// permanentMessageRefusal: the server refuses one message for good; that
// message alone fails permanently, its aggregate's later messages fail
// without being blamed (not permanent), and every other message that
// shared its call is acknowledged and delivered.
func permanentMessageRefusal(t *testing.T, h Harness) {
	r := start(t, h)
	r.need(r.sink.RefuseMessage != nil, "RefuseMessage", "a permanent refusal of one message (a failure attributed to its own message only)")
	x := r.dest("x")
	aggs := aggregates(5)
	var batch []relay.Message
	for i := range 20 {
		batch = append(batch, r.msg(x, aggs[i%5], "", nil))
	}
	refused := batch[5] // aggs[0]'s second message
	r.sink.RefuseMessage(t, x, refused.ID)
	errs := r.publish(batch)
	for i, m := range batch {
		switch {
		case m.ID == refused.ID:
			r.permanent(m, errs[i], "")
		case m.AggregateID == refused.AggregateID && m.ID > refused.ID:
			r.retriable(m, errs[i], fmt.Sprintf("it comes after message %d of its aggregate, which was refused", refused.ID))
		default:
			r.ok(m, errs[i], fmt.Sprintf("only message %d was refused: a failure belongs to the message that caused it", refused.ID))
		}
	}
	r.check(x, acked(batch, errs), refused.ID)
}

// permanentDestinationRefusal: a destination refuses every message; its
// messages fail, the first of each aggregate permanently, while the
// messages to another destination in the same call are acknowledged and
// delivered.
func permanentDestinationRefusal(t *testing.T, h Harness) {
	r := start(t, h)
	r.need(r.sink.RefuseDestination != nil, "RefuseDestination", "a permanent refusal of one destination")
	x, y := r.dest("x"), r.dest("y")
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	var batch, toY []relay.Message
	var refused []int64
	for range 4 {
		mx, mb, mc := r.msg(x, a, "", nil), r.msg(y, b, "", nil), r.msg(y, c, "", nil)
		batch = append(batch, mx, mb, mc)
		toY = append(toY, mb, mc)
		refused = append(refused, mx.ID)
	}
	r.sink.RefuseDestination(t, x)
	errs := r.publish(batch)
	for i, m := range batch {
		switch {
		case i == 0:
			r.permanent(m, errs[i], "")
		case m.Topic == x:
			if errs[i] == nil {
				t.Errorf("sinktest: %s: message %d to refused destination %s was acknowledged", r.name, m.ID, x)
			}
		default:
			r.ok(m, errs[i], "only another destination refused: a failure belongs to the message that caused it")
		}
	}
	r.check(y, toY)
	r.check(x, nil, refused...)
}

// sizeLimit: a message over the sink's limit fails alone, permanently,
// as too_large, before or instead of reaching the destination; its
// aggregate's later messages are not acknowledged ahead of it; messages
// that fit are acknowledged, several in one call even when together they
// exceed the limit.
func sizeLimit(t *testing.T, h Harness) {
	r := start(t, h)
	r.need(r.sink.MaxBytes > 0, "MaxBytes", "the size limit")
	limit := r.sink.MaxBytes
	x := r.dest("x")
	aggs := aggregates(4)
	fit := padded(max(limit*2/5, 16))
	batch := []relay.Message{
		r.msg(x, aggs[0], "", nil),
		r.msg(x, aggs[0], padded(limit+1), nil),
		r.msg(x, aggs[0], "", nil),
		r.msg(x, aggs[1], fit, nil),
		r.msg(x, aggs[2], fit, nil),
		r.msg(x, aggs[3], fit, nil),
		r.msg(x, aggs[1], "", nil),
	}
	big := batch[1]
	errs := r.publish(batch)
	for i, m := range batch {
		switch i {
		case 1:
			r.permanent(m, errs[i], relay.ReasonTooLarge)
		case 2:
			r.retriable(m, errs[i], fmt.Sprintf("it comes after message %d of its aggregate, which is too large", big.ID))
		default:
			r.ok(m, errs[i], fmt.Sprintf("it fits the limit of %d bytes; only message %d (%d bytes) is too large", limit, big.ID, len(big.Payload)))
		}
	}
	r.check(x, acked(batch, errs), big.ID)
}

// aggregateAcrossDestinations: an aggregate's messages go to two
// destinations, and one of them fails for now; the aggregate's messages
// after the failed one are not acknowledged ahead of it, even on the
// destination that works, while other aggregates' messages there are.
func aggregateAcrossDestinations(t *testing.T, h Harness) {
	r := start(t, h)
	r.need(r.sink.FailDestination != nil, "FailDestination", "order across destinations under a transient failure")
	x, y := r.dest("x"), r.dest("y")
	a, b := uuid.New(), uuid.New()
	batch := []relay.Message{
		r.msg(x, a, "", nil),
		r.msg(y, a, "", nil),
		r.msg(x, a, "", nil),
		r.msg(x, b, "", nil),
		r.msg(x, a, "", nil),
	}
	failing := batch[1]
	heal := r.sink.FailDestination(t, y)
	errs := r.publish(batch)
	r.ok(batch[0], errs[0], "it comes before the failing message of its aggregate")
	r.retriable(failing, errs[1], "its destination was set to fail, for now")
	for _, i := range []int{2, 4} {
		r.retriable(batch[i], errs[i], fmt.Sprintf("it comes after message %d of its aggregate, which failed on %s", failing.ID, y))
	}
	r.ok(batch[3], errs[3], "its aggregate has no failed message")
	heal()
	r.publishAll(unacked(batch, errs))
	r.check(x, []relay.Message{batch[0], batch[2], batch[3], batch[4]})
	r.check(y, []relay.Message{failing})
}
