package rowheaders_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/internal/rowheaders"
)

// A row's headers are published when the insert guard would have let them
// in, and refused for good, with a reason and what to do, when not (rows
// from before the guard, logical messages of the WAL source).
func TestDecode(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"", "null", "{}"} {
		h, err := rowheaders.Decode([]byte(raw), relay.PermanentReason)
		require.NoError(t, err, raw)
		require.Empty(t, h, raw)
	}
	h, err := rowheaders.Decode([]byte(`{"trace": "abc", "empty": ""}`), relay.PermanentReason)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"trace": "abc", "empty": ""}, h)

	for raw, want := range map[string]struct {
		reason string
		text   string
	}{
		`{"retries": 3}`:        {relay.ReasonUndecodable, "not a JSON object of string values"},
		`["a"]`:                 {relay.ReasonUndecodable, "not a JSON object of string values"},
		`{"trace": null}`:       {relay.ReasonUndecodable, `header "trace" is null, not a string; set a value or drop the header`},
		`{"": "v"}`:             {relay.ReasonUndecodable, "have an empty name; rename it"},
		`{"event_id": "1"}`:     {relay.ReasonReservedHeader, `header "event_id" is set by the relayer`},
		`{"a": "1", "b": null}`: {relay.ReasonUndecodable, `header "b" is null`},
		// Undecodable before reserved, whatever the map's order.
		`{"event_id": "1", "b": null}`: {relay.ReasonUndecodable, `header "b" is null`},
		`{"event_id": "1", "": "x"}`:   {relay.ReasonUndecodable, "have an empty name"},
	} {
		_, err := rowheaders.Decode([]byte(raw), relay.PermanentReason)
		require.ErrorContains(t, err, want.text, raw)
		require.True(t, relay.IsPermanent(err), raw)
		require.Equal(t, want.reason, relay.ReasonOf(err), raw)
	}
}
