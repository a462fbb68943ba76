package walrelay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// A status update is due StatusInterval after the last one, or statusGap
// after it (StatusInterval if shorter) once the broker acknowledged more
// than the server was told.
func TestStatusIsDueSoonAfterAnUntoldAcknowledgement(t *testing.T) {
	t.Parallel()
	last := time.Unix(1000, 0)
	st := &streamer{r: &Relayer{cfg: Config{StatusInterval: 10 * time.Second}}, lastStatus: last}
	st.acked, st.sentAcked = 100, 100
	require.Equal(t, last.Add(10*time.Second), st.nextStatus(), "nothing new to tell")
	st.acked = 200
	require.Equal(t, last.Add(statusGap), st.nextStatus(), "a new position to tell")
	st.r.cfg.StatusInterval = statusGap / 2
	require.Equal(t, last.Add(statusGap/2), st.nextStatus(), "StatusInterval, if shorter")
}

// A queue waits for more only while the stream is behind, for at most
// lingerMax after it started, and while it is below both batch bounds.
func TestQueueLingersOnlyWhileBehindAndBelowTheBatchBounds(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	st := &streamer{r: &Relayer{cfg: Config{Common: relay.Common{BatchSize: 3, MaxBatchBytes: 1 << 20}}}}
	require.False(t, st.lingering(now), "nothing queued")
	st.enqueue(item{msg: relay.Message{ID: 1, Payload: []byte(`{}`)}})
	st.queuedAt = now
	st.commit = now.Add(-2 * behindAge)
	require.True(t, st.lingering(now), "behind, one event queued")
	require.False(t, st.lingering(now.Add(lingerMax)), "lingered lingerMax already")
	st.commit = now
	require.False(t, st.lingering(now), "not behind")
	st.commit = now.Add(-2 * behindAge)
	st.enqueue(item{msg: relay.Message{ID: 2, Payload: []byte(`{}`)}})
	st.enqueue(item{msg: relay.Message{ID: 3, Payload: []byte(`{}`)}})
	require.False(t, st.lingering(now), "a full batch")
	st.take(3, 1<<20)
	st.r.cfg.MaxBatchBytes = 10
	st.enqueue(item{msg: relay.Message{ID: 4, Payload: make([]byte, 10)}})
	st.queuedAt = now
	require.False(t, st.lingering(now), "MaxBatchBytes queued")
}
