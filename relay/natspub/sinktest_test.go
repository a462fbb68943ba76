package natspub_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/natspub"
	"github.com/pgoutbox/outbox/relay/sinktest"
	"github.com/pgoutbox/outbox/routing"
)

// sinkMaxBytes is the max_msg_size of every suite stream.
const sinkMaxBytes = 100_000

// fillerHeader marks the message the harness stores to bring a stream to
// its limit; Read leaves it out, as it is none of the suite's.
const fillerHeader = "Sinktest-Filler"

// The NATS publisher passes the sink suite on a private nats-server per
// case, run as an operator runs one: a stream per destination, capturing
// exactly that subject, created before the first message to it goes out.
// The faults are the server's own:
//
//   - RefuseDestination: no stream captures the destination (it is
//     deleted if it exists, and never created), so the publisher holds its
//     messages with invalid_topic.
//   - FailDestination: the destination's stream has discard-new and
//     max_msgs at what it holds (a filler message, which Read leaves out),
//     so the server refuses for now (stream_full); heal lifts the limit.
//
// FailMessage and RefuseMessage stay undeclared: JetStream judges a
// message by its subject (streams, permissions, per-subject limits), its
// size (max_payload, max_msg_size) and Nats-Expected-* headers (which the
// publisher never sends), never by the event id it carries; the one
// mechanism keyed on the id, Nats-Msg-Id deduplication, acknowledges a
// copy rather than refusing it. Failing one message of a
// subject while its neighbours go through would take a fake server or a
// wrapper that fails messages itself, which would not test the sink.
// TestStreamFullFailsForNow and TestMessageSizeIsTheServers cover a
// refusal inside a call with subjects of their own.
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "nats", New: natsSink(natspub.Config{})})
}

// With CloudEvents headers stamped, the publisher passes the same suite.
func TestSinkConformanceCloudEvents(t *testing.T) {
	t.Parallel()
	cfg := natspub.Config{CloudEvents: &cloudevents.Config{Source: "urn:outbox:conformance"}}
	sinktest.Run(t, sinktest.Harness{Name: "nats-cloudevents", New: natsSink(cfg)})
}

func natsSink(cfg natspub.Config) func(t *testing.T) *sinktest.Sink {
	return func(t *testing.T) *sinktest.Sink { return natsSinkWith(t, cfg) }
}

func natsSinkWith(t *testing.T, cfg natspub.Config) *sinktest.Sink {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv.URL())
	pub, err := natspub.New(nc, cfg)
	require.NoError(t, err)
	op := &operator{t: t, js: js, refused: map[string]bool{}, created: map[string]bool{}}
	return &sinktest.Sink{
		Sink:              provisioned{Publisher: pub, op: op},
		Read:              op.read,
		MaxBytes:          sinkMaxBytes,
		FailDestination:   op.fill,
		RefuseDestination: op.refuse,
	}
}

// provisioned is the publisher under test behind an operator who adds a
// stream for each destination before it is published to: the messages
// reach the real publisher unchanged.
type provisioned struct {
	*natspub.Publisher
	op *operator
}

// Publish makes sure every destination of msgs the case did not refuse
// has its stream, then hands msgs to the publisher.
func (p provisioned) Publish(ctx context.Context, msgs []relay.Message) []error {
	for i := range msgs {
		p.op.ensure(ctx, msgs[i].Topic)
	}
	return p.Publisher.Publish(ctx, msgs)
}

// operator keeps one case's streams: one per destination, named as it.
type operator struct {
	t  *testing.T
	js jetstream.JetStream

	mu      sync.Mutex
	refused map[string]bool
	created map[string]bool
}

// adminTimeout bounds one stream operation of the harness.
const adminTimeout = 30 * time.Second

// ensure creates dest's stream unless it was refused or exists.
func (o *operator) ensure(ctx context.Context, dest string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.refused[dest] || o.created[dest] {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	cfg := jetstream.StreamConfig{Name: dest, Subjects: []string{dest}, MaxMsgSize: sinkMaxBytes, Discard: jetstream.DiscardNew}
	if _, err := o.js.CreateStream(ctx, cfg); err != nil {
		o.t.Errorf("natspub harness: create stream %s: %v", dest, err)
		return
	}
	o.created[dest] = true
}

// refuse leaves dest without a stream for good.
func (o *operator) refuse(t *testing.T, dest string) {
	t.Helper()
	o.mu.Lock()
	o.refused[dest] = true
	delete(o.created, dest)
	o.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := o.js.DeleteStream(ctx, dest); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("natspub harness: delete stream %s: %v", dest, err)
	}
}

// fill brings dest's stream to a max_msgs limit it already holds, so
// that with discard-new the server refuses every new message; heal lifts
// the limit.
func (o *operator) fill(t *testing.T, dest string) (heal func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	o.ensure(ctx, dest)
	filler := &nats.Msg{Subject: dest, Header: nats.Header{fillerHeader: []string{"1"}}, Data: []byte(`{}`)}
	_, err := o.js.PublishMsg(ctx, filler)
	require.NoError(t, err, "store the filler on %s", dest)
	s, err := o.js.Stream(ctx, dest)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	cfg := info.Config
	cfg.MaxMsgs = int64(info.State.Msgs)
	_, err = o.js.UpdateStream(ctx, cfg)
	require.NoError(t, err, "limit stream %s to %d messages", dest, cfg.MaxMsgs)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		cfg.MaxMsgs = -1
		_, err := o.js.UpdateStream(ctx, cfg)
		require.NoError(t, err, "lift the limit of stream %s", dest)
	}
}

// read returns what dest's stream holds, the filler left out; nothing
// when dest has no stream. An acknowledged message is stored: nothing to
// wait for.
func (o *operator) read(t *testing.T, dest string, _ int) []sinktest.Delivered {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	_, err := o.js.Stream(ctx, dest)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	require.NoError(t, err)
	var msgs []natstest.Msg
	for _, m := range natstest.ReadStream(t, o.js, dest, dest) {
		if m.Header.Get(fillerHeader) == "" {
			msgs = append(msgs, m)
		}
	}
	return delivered(t, msgs)
}

// delivered decodes stored messages as a consumer reads them: the
// relayer's headers, the event's own unescaped.
func delivered(t *testing.T, msgs []natstest.Msg) []sinktest.Delivered {
	t.Helper()
	out := make([]sinktest.Delivered, 0, len(msgs))
	for _, m := range msgs {
		h := map[string]string{}
		for k, vs := range m.Header {
			name, value, err := routing.UnescapeNATSHeader(k, vs[0])
			require.NoError(t, err)
			h[name] = value
		}
		id, _ := strconv.ParseInt(h[outbox.HeaderEventID], 10, 64)
		out = append(out, sinktest.Delivered{ID: id, Key: h[outbox.HeaderAggregateID], Type: h[outbox.HeaderEventType], Payload: m.Data, Headers: h})
	}
	return out
}
