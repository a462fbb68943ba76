package consumer

import (
	"testing"

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
