package natspub_test

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/relay/natspub"
	"github.com/pgoutbox/outbox/relay/sinktest"
	"github.com/pgoutbox/outbox/routing"
)

// sinkMaxBytes is the suite stream's max_msg_size.
const sinkMaxBytes = 100_000

// The NATS publisher passes the sink suite on a private nats-server per
// case, whose one stream captures every single-token subject (the
// suite's destinations). The server cannot be made to fail or refuse one
// message by its id, and a stream that captures every destination cannot
// leave one of them out, so the cases that need FailMessage,
// RefuseMessage, FailDestination or RefuseDestination are skipped here;
// TestRefusedAndFailingSubjects covers a subject no stream captures and a
// stream that refuses for now, with subjects of its own.
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "nats", New: natsSink})
}

func natsSink(t *testing.T) *sinktest.Sink {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv.URL())
	natstest.AddStream(t, js, jetstream.StreamConfig{Name: "SINKTEST", Subjects: []string{"*"}, MaxMsgSize: sinkMaxBytes})
	pub, err := natspub.New(nc, natspub.Config{})
	require.NoError(t, err)
	return &sinktest.Sink{
		Sink: pub,
		Read: func(t *testing.T, dest string, _ int) []sinktest.Delivered {
			// An acknowledged message is stored: nothing to wait for.
			return delivered(t, natstest.ReadStream(t, js, "SINKTEST", dest))
		},
		MaxBytes: sinkMaxBytes,
	}
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
