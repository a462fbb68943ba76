package dlq_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer/dlq"
)

// A pointer record lost its payload, and a record no consumer wrote does
// not say where it came from: neither can be sent back, and the error says
// what to do instead.
func TestReplayableRefusesWhatCannotGoBack(t *testing.T) {
	t.Parallel()
	ok := dlq.Letter{Destination: "order.dlq", Position: "0/4", OriginalTopic: "order", EventID: 9, Payload: []byte(`{}`)}
	require.NoError(t, ok.Replayable())

	pointer := ok
	pointer.ValueDropped, pointer.Payload = 2_000_000, nil
	require.ErrorContains(t, pointer.Replayable(), "replay event 9 from the outbox instead: outbox events replay --from-id 9 --to-id 9")

	foreign := ok
	foreign.OriginalTopic = ""
	require.ErrorContains(t, foreign.Replayable(), "no dlq_original_* header")
}

// Filter keeps the letters that match every condition, in order.
func TestFilterKeepsMatchingLettersInOrder(t *testing.T) {
	t.Parallel()
	letters := []dlq.Letter{
		{Position: "0/1", Consumer: "billing", EventID: 1},
		{Position: "0/2", Consumer: "loyalty", EventID: 2},
		{Position: "1/1", Consumer: "billing", EventID: 3},
	}
	pos := func(ls []dlq.Letter) []string {
		var out []string
		for _, l := range ls {
			out = append(out, l.Position)
		}
		return out
	}
	require.Equal(t, []string{"0/1", "0/2", "1/1"}, pos(dlq.Filter{}.Apply(letters)))
	require.Equal(t, []string{"0/1", "1/1"}, pos(dlq.Filter{Consumer: "billing"}.Apply(letters)))
	require.Equal(t, []string{"1/1"}, pos(dlq.Filter{Consumer: "billing", EventIDs: []int64{2, 3}}.Apply(letters)))
	require.Empty(t, dlq.Filter{Consumer: "nobody"}.Apply(letters))
}
