package monitor_test

import (
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay"
)

// The polling relayer's Metrics count its lane events (exactly-once): the
// events by kind, and the events settled when a lane was opened by
// outcome; a skip counts events, not an event of the lane.
func TestMetricsCountLaneEvents(t *testing.T) {
	t.Parallel()
	m := monitor.NewMetrics()
	var hook relay.LaneHook = m
	for _, ev := range []relay.LaneEvent{
		{Kind: relay.LaneOpened, Lane: "outbox/x/poll-1"},
		{Kind: relay.LaneAborted, Lane: "outbox/x/poll-1", Err: relay.ErrAborted},
		{Kind: relay.LaneLost, Lane: "outbox/x/poll-1", Err: errors.New("fenced")},
		{Kind: relay.LaneOpened, Lane: "outbox/x/poll-2", Published: 30},
		{Kind: relay.LaneOpened, Lane: "outbox/x/poll-3", Returned: 12},
		{Kind: relay.LaneSkipped, Lane: "outbox/x/wal/s", Skipped: 5},
	} {
		hook.OnLane(ev)
	}
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	got := scrape(t, srv.URL)
	for _, c := range []struct {
		name, label, value string
		want               float64
	}{
		{"outbox_lane_events_total", "event", "opened", 3},
		{"outbox_lane_events_total", "event", "aborted", 1},
		{"outbox_lane_events_total", "event", "lost", 1},
		{"outbox_lane_recovered_events_total", "outcome", "published", 30},
		{"outbox_lane_recovered_events_total", "outcome", "returned", 12},
		{"outbox_lane_recovered_events_total", "outcome", "skipped", 5},
	} {
		v, ok := got.value(c.name, c.label, c.value)
		require.True(t, ok, "%s{%s=%q}", c.name, c.label, c.value)
		require.Equal(t, c.want, v, "%s{%s=%q}", c.name, c.label, c.value)
	}
	_, ok := got.value("outbox_lane_events_total", "event", "skipped")
	require.False(t, ok, "a skip is counted in events, not as a lane event")
}
