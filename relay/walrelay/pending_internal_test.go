package walrelay

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// While a batch is out (or retries), commits that queue nothing (other
// tables' transactions) add no bookkeeping: pending grows per mark, not
// per transaction, and keeps the oldest commit's time.
func TestPendingGrowsPerMarkNotPerTransaction(t *testing.T) {
	t.Parallel()
	r := &Relayer{}
	s := &streamer{r: r}
	s.enqueue(item{msg: relay.Message{ID: 1, Payload: []byte(`{}`)}})
	first := time.Unix(1000, 0)
	s.checkpoint(100, first)
	for i := range 10_000 {
		s.checkpoint(pglogrepl.LSN(200+i), first.Add(time.Duration(i+1)*time.Second))
	}
	require.Len(t, s.marks, 1)
	require.Equal(t, 1, len(s.pending), "pending entries")
	require.Equal(t, first, s.pending[0].committed)

	// A mark made by a heartbeat (no commit time) gets one when a commit
	// joins it.
	s.enqueue(item{msg: relay.Message{ID: 2, Payload: []byte(`{}`)}})
	s.checkpoint(20_000, time.Time{})
	s.checkpoint(20_001, first.Add(time.Hour))
	require.Len(t, s.marks, 2)
	require.Equal(t, 2, len(s.pending), "pending entries")

	b := s.take(10, 1<<20)
	require.Len(t, b.items, 2)
	require.Equal(t, pglogrepl.LSN(20_001), b.end)
	s.advance(b.end)
	require.Empty(t, s.pending)
	require.Zero(t, s.bytes)
}

// take cuts a batch before the item that would cross maxBytes; a larger
// item goes alone.
func TestTakeCutsByBytes(t *testing.T) {
	t.Parallel()
	r := &Relayer{}
	s := &streamer{r: r}
	for i, n := range []int{40, 40, 40, 200, 10} {
		s.enqueue(item{msg: relay.Message{ID: int64(i + 1), Payload: make([]byte, n)}})
	}
	require.Equal(t, 330, s.bytes)
	require.Len(t, s.take(100, 100).items, 2)
	require.Len(t, s.take(100, 100).items, 1)
	require.Len(t, s.take(100, 100).items, 1, "a larger item goes alone")
	require.Len(t, s.take(100, 100).items, 1)
	require.Zero(t, s.bytes)
	require.EqualValues(t, 330, r.queuedBytesMax.Load())
}
