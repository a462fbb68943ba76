package natspub_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/relay/natspub"
)

// A binary payload is the message's data byte for byte, with its content
// type in the content-type header; a JSON one keeps application/json.
func TestBinaryPayloadsCarryTheirContentType(t *testing.T) {
	t.Parallel()
	b := setup(t, natspub.Config{}, jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"}})
	agg := uuid.New()
	data := []byte{0x0a, 0, 0xff, 0xfe, '\r', '\n', 0}
	bin := msg(1, agg, "b.event", "")
	bin.Payload, bin.ContentType = data, "application/x-protobuf"
	for i, err := range publish(t, b.pub, bin, msg(2, agg, "b.event", `{"a" : 1}`)) {
		require.NoError(t, err, i)
	}
	got := natstest.ReadStream(t, b.js, "B", "")
	require.Len(t, got, 2)
	require.Equal(t, data, got[0].Data)
	require.Equal(t, "application/x-protobuf", got[0].Header.Get(outbox.HeaderContentType))
	require.Equal(t, `{"a" : 1}`, string(got[1].Data))
	require.Equal(t, outbox.ContentTypeJSON, got[1].Header.Get(outbox.HeaderContentType))
}
