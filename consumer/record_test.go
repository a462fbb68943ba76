package consumer

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
)

// decode reads each reserved header's first occurrence (the relayer's) and
// every other header's last.
func TestDecodeReservedHeadersFirstWins(t *testing.T) {
	t.Parallel()
	h := func(kv ...string) []kgo.RecordHeader {
		var out []kgo.RecordHeader
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return out
	}
	ev, bad := decode(&kgo.Record{Value: []byte(`{}`), Headers: h(
		outbox.HeaderEventID, "5",
		outbox.HeaderEventType, "item.ok",
		outbox.HeaderContentType, outbox.ContentTypeJSON,
		outbox.HeaderEventSource, "relayer-src",
		"trace", "t1",
		outbox.HeaderEventSource, "evil",
		outbox.HeaderEventID, "6",
		outbox.HeaderEventType, "item.other",
		outbox.HeaderContentType, "text/plain",
		"trace", "t2",
	)})
	require.Nil(t, bad)
	require.EqualValues(t, 5, ev.ID)
	require.Equal(t, "item.ok", ev.Type)
	require.Equal(t, "relayer-src", ev.Source)
	require.Equal(t, map[string]string{
		outbox.HeaderEventID:     "5",
		outbox.HeaderEventType:   "item.ok",
		outbox.HeaderContentType: outbox.ContentTypeJSON,
		outbox.HeaderEventSource: "relayer-src",
		"trace":                  "t2",
	}, ev.Headers)

	// A malformed first event_id is not rescued by a well-formed second.
	_, bad = decode(&kgo.Record{Value: []byte(`{}`), Headers: h(outbox.HeaderEventID, "abc", outbox.HeaderEventID, "5")})
	require.NotNil(t, bad)
	require.Contains(t, bad.Error(), `event_id header "abc" is not a positive decimal integer`)
}

// A binary payload (its content-type header not JSON) is handed over
// byte for byte; one that says JSON is still checked; no header means
// JSON, as before binary payloads.
func TestDecodeBinaryPayloadByContentType(t *testing.T) {
	t.Parallel()
	rec := func(value []byte, ct string) *kgo.Record {
		hs := []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte("7")}, {Key: outbox.HeaderEventType, Value: []byte("order.placed")}}
		if ct != "" {
			hs = append(hs, kgo.RecordHeader{Key: outbox.HeaderContentType, Value: []byte(ct)})
		}
		return &kgo.Record{Value: value, Headers: hs}
	}
	data := []byte{0x0a, 0, 0xff, 0xc3, 0x28}
	ev, bad := decode(rec(data, "application/x-protobuf"))
	require.Nil(t, bad)
	require.Equal(t, data, ev.Payload)
	require.Equal(t, "application/x-protobuf", ev.ContentType)

	for _, ct := range []string{"", outbox.ContentTypeJSON, "application/vnd.x+json; charset=utf-8"} {
		_, bad = decode(rec(data, ct))
		require.NotNil(t, bad, "content type %q", ct)
		require.Contains(t, bad.Error(), "not valid JSON")
	}
	ev, bad = decode(rec([]byte(`{"a" : 1, "a": 2}`), ""))
	require.Nil(t, bad)
	require.Equal(t, outbox.ContentTypeJSON, ev.ContentType)
	require.Equal(t, `{"a" : 1, "a": 2}`, string(ev.Payload))
}

// Typed decodes JSON only: a payload of another content type fails
// permanently, saying so, before the handler runs.
func TestTypedRefusesPayloadsThatAreNotJSON(t *testing.T) {
	t.Parallel()
	called := false
	h := Typed(func(_ context.Context, _ pgx.Tx, _ Event, v struct{ A int }) error {
		called = true
		require.Equal(t, 2, v.A)
		return nil
	})
	err := h(context.Background(), nil, Event{Type: "order.placed", ContentType: "application/x-protobuf", Payload: []byte{0x08, 0x02}})
	require.True(t, IsPermanent(err))
	require.ErrorContains(t, err, `"application/x-protobuf", not JSON`)
	require.False(t, called)
	require.NoError(t, h(context.Background(), nil, Event{Type: "order.placed", ContentType: "application/json; charset=utf-8", Payload: []byte(`{"A": 2}`)}))
	require.True(t, called)
}
