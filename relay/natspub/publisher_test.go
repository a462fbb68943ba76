package natspub_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/natspub"
	"github.com/pgoutbox/outbox/routing"
)

type bundle struct {
	srv *natstest.Server
	js  jetstream.JetStream
	pub *natspub.Publisher
}

func setup(t *testing.T, cfg natspub.Config, streams ...jetstream.StreamConfig) bundle {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv.URL())
	for _, s := range streams {
		natstest.AddStream(t, js, s)
	}
	pub, err := natspub.New(nc, cfg)
	require.NoError(t, err)
	return bundle{srv: srv, js: js, pub: pub}
}

func msg(id int64, agg uuid.UUID, subject, payload string) relay.Message {
	return relay.Message{ID: id, AggregateID: agg, Type: subject, Topic: subject, Payload: []byte(payload)}
}

func publish(t *testing.T, p *natspub.Publisher, msgs ...relay.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	require.Len(t, errs, len(msgs))
	return errs
}

func ids(t *testing.T, js jetstream.JetStream, stream, subject string) []int64 {
	t.Helper()
	var out []int64
	for _, m := range natstest.ReadStream(t, js, stream, subject) {
		id, err := strconv.ParseInt(m.Header.Get(outbox.HeaderEventID), 10, 64)
		require.NoError(t, err)
		out = append(out, id)
	}
	return out
}

// A subject no stream captures holds its message with invalid_topic (and
// the aggregate's later messages unsent, not blamed), while the messages
// beside it are stored; once a stream captures it, the held messages go
// through in order.
func TestSubjectNoStreamCaptures(t *testing.T) {
	t.Parallel()
	b := setup(t, natspub.Config{}, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"order.>"}})
	a, c := uuid.New(), uuid.New()
	batch := []relay.Message{
		msg(1, a, "order.placed", `{}`),
		msg(2, a, "invoice.sent", `{}`),
		msg(3, a, "order.shipped", `{}`),
		msg(4, c, "order.placed", `{}`),
	}
	errs := publish(t, b.pub, batch...)
	require.NoError(t, errs[0])
	require.Equal(t, relay.ReasonInvalidTopic, relay.ReasonOf(errs[1]), "%v", errs[1])
	require.Contains(t, errs[1].Error(), `"invoice.sent"`)
	require.Equal(t, "no_stream", b.pub.ErrorCode(errs[1]))
	require.Error(t, errs[2])
	require.False(t, relay.IsPermanent(errs[2]), "message 3 only waits behind message 2: %v", errs[2])
	require.NoError(t, errs[3])
	require.Equal(t, []int64{1, 4}, ids(t, b.js, "ORDERS", ""))

	natstest.AddStream(t, b.js, jetstream.StreamConfig{Name: "INVOICES", Subjects: []string{"invoice.>"}})
	errs = publish(t, b.pub, batch[1], batch[2])
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, []int64{2}, ids(t, b.js, "INVOICES", ""))
	require.Equal(t, []int64{1, 4, 3}, ids(t, b.js, "ORDERS", ""))
}

// A stream with discard-new at its message limit refuses for now: its
// messages fail, none permanently; the aggregate's later messages, on
// another stream too, are not acknowledged ahead of the failed one, while
// other aggregates' go through; once the stream has room, sending the
// unacknowledged ones again delivers everything in order.
func TestStreamFullFailsForNow(t *testing.T) {
	t.Parallel()
	full := jetstream.StreamConfig{Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew}
	b := setup(t, natspub.Config{}, full, jetstream.StreamConfig{Name: "OK", Subjects: []string{"ok.>"}})
	a, c := uuid.New(), uuid.New()
	require.NoError(t, publish(t, b.pub, msg(1, c, "full.x", `{}`))[0])
	batch := []relay.Message{
		msg(2, a, "ok.x", `{}`),
		msg(3, a, "full.x", `{}`),
		msg(4, a, "ok.x", `{}`),
		msg(5, c, "ok.x", `{}`),
	}
	errs := publish(t, b.pub, batch...)
	require.NoError(t, errs[0])
	require.Error(t, errs[1])
	require.False(t, relay.IsPermanent(errs[1]), "a full stream refuses for now: %v", errs[1])
	require.Equal(t, "stream_full", b.pub.ErrorCode(errs[1]), "%v", errs[1])
	require.Error(t, errs[2], "message 4 must not be acknowledged ahead of message 3 of its aggregate")
	require.False(t, relay.IsPermanent(errs[2]))
	require.NoError(t, errs[3])
	require.Equal(t, []int64{2, 5}, ids(t, b.js, "OK", ""))
	require.Error(t, b.pub.Ready(context.Background()), "the last publish failed for now")

	full.MaxMsgs = -1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.js.UpdateStream(ctx, full)
	require.NoError(t, err)
	errs = publish(t, b.pub, batch[1], batch[2])
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, []int64{1, 3}, ids(t, b.js, "FULL", ""))
	require.Equal(t, []int64{2, 5, 4}, ids(t, b.js, "OK", ""))
	require.NoError(t, b.pub.Ready(ctx))
}

// The size the publisher checks is the size the server checks: with the
// publisher told of a larger limit than the stream's, a message of
// exactly the stream's max_msg_size is stored and one byte more is
// refused by the server, as too_large.
func TestMessageSizeIsTheServers(t *testing.T) {
	t.Parallel()
	const limit = 4096
	b := setup(t, natspub.Config{MaxPayloadBytes: 1 << 20, Source: "shop"},
		jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxMsgSize: limit})
	hdrs := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "odd key": " padded "}
	base := routing.NATS{}.MessageSize(7, "s.event", 0, hdrs, "shop")
	fits := msg(7, uuid.New(), "s.event", padded(limit-base))
	fits.Headers = hdrs
	over := msg(8, uuid.New(), "s.event", padded(limit-base+1))
	over.Headers = hdrs
	errs := publish(t, b.pub, fits, over)
	require.NoError(t, errs[0], "a message of exactly max_msg_size fits")
	require.Equal(t, relay.ReasonTooLarge, relay.ReasonOf(errs[1]), "%v", errs[1])
	require.Equal(t, []int64{7}, ids(t, b.js, "S", ""))
}

// Without an override, the publisher learns the stream's max_msg_size and
// refuses a larger message before sending it, naming the limit.
func TestLearnsStreamLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, natspub.Config{}, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxMsgSize: 2000})
	errs := publish(t, b.pub, msg(1, uuid.New(), "s.event", padded(2000)), msg(2, uuid.New(), "s.event", padded(1000)))
	require.Equal(t, relay.ReasonTooLarge, relay.ReasonOf(errs[0]), "%v", errs[0])
	require.Contains(t, errs[0].Error(), "the stream's max_msg_size")
	require.NoError(t, errs[1])
}

// Headers reach the stream byte for byte, escaped where NATS would change
// them; Nats-Msg-Id is the source-qualified id and the stream drops a
// second copy; a row header named aggregate_id is held.
func TestHeadersAndDedupe(t *testing.T) {
	t.Parallel()
	b := setup(t, natspub.Config{Source: "shop"}, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	agg := uuid.New()
	m := msg(42, agg, "s.event", `{"a": 1}`)
	m.Headers = map[string]string{"plain": "v", "Nats-Expected-Stream": "OTHER", "line": "a\r\nb", "~tilde": "x"}
	bad := msg(43, uuid.New(), "s.event", `{}`)
	bad.Headers = map[string]string{outbox.HeaderAggregateID: "mine"}
	errs := publish(t, b.pub, m, m, bad)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1], "a copy is acknowledged as a duplicate")
	require.Equal(t, relay.ReasonReservedHeader, relay.ReasonOf(errs[2]), "%v", errs[2])
	got := natstest.ReadStream(t, b.js, "S", "")
	require.Len(t, got, 1, "the stream drops the copy with the same Nats-Msg-Id")
	h := got[0].Header
	require.Equal(t, "shop:42", h.Get(routing.HeaderNATSMsgID))
	require.Equal(t, "42", h.Get(outbox.HeaderEventID))
	require.Equal(t, "shop", h.Get(outbox.HeaderEventSource))
	require.Equal(t, agg.String(), h.Get(outbox.HeaderAggregateID))
	require.Equal(t, "s.event", h.Get(outbox.HeaderEventType))
	require.Equal(t, outbox.ContentTypeJSON, h.Get(outbox.HeaderContentType))
	require.Equal(t, "v", h.Get("plain"))
	require.Empty(t, h.Get("Nats-Expected-Stream"), "a row header must not steer the server")
	dec := delivered(t, got)[0].Headers
	for k, v := range m.Headers {
		require.Equal(t, v, dec[k], "header %q", k)
	}
}

func padded(n int) string {
	const head, tail = `{"pad": "`, `"}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// A call with more aggregates than MaxInFlight sends them in chunks of
// MaxInFlight: every chunk is sent and acknowledged.
func TestMoreAggregatesThanInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, natspub.Config{MaxInFlight: 7}, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	var batch []relay.Message
	for i := range 100 {
		batch = append(batch, msg(int64(i+1), uuid.New(), "s.event", `{}`))
	}
	for i, err := range publish(t, b.pub, batch...) {
		require.NoError(t, err, "message %d", i+1)
	}
	require.Len(t, ids(t, b.js, "S", ""), 100)
}
