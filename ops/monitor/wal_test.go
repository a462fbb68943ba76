package monitor_test

import (
	"context"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay"
)

// The monitor of a WAL source serves the relayer's counters and the slot's state.
func TestWALMonitorMetrics(t *testing.T) {
	t.Parallel()
	db, slot := walSetup(t)
	figures := func() monitor.WALFigures {
		return monitor.WALFigures{Published: 7, Parked: 2, Heartbeats: 3, Leading: true, Lag: 1500 * time.Millisecond}
	}
	lanes := monitor.NewLaneMetrics()
	mon, err := monitor.New(monitor.Config{Pool: db.Pool, Tables: db.Tables, Source: ops.WAL(slot), WALFigures: figures, Lanes: lanes, Logger: opstest.Logger(t)})
	require.NoError(t, err)
	lanes.OnLane(relay.LaneEvent{Kind: relay.LaneOpened, Lane: "outbox/x/wal/s"})
	lanes.OnLane(relay.LaneEvent{Kind: relay.LaneSkipped, Lane: "outbox/x/wal/s", Skipped: 40})
	mon.Refresh(context.Background())
	rec := httptest.NewRecorder()
	mon.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{"outbox_events_dispatched_total 7", "outbox_wal_parked_total 2", "outbox_wal_heartbeats_total 3",
		"outbox_wal_leader 1", "outbox_wal_slot_lag_seconds 1.5", "outbox_wal_slot_active 0",
		`outbox_wal_slot_wal_status{status="reserved"} 1`, `outbox_wal_slot_wal_status{status="lost"} 0`, "outbox_wal_slot_lag_bytes ",
		`outbox_lane_events_total{event="opened"} 1`, `outbox_lane_recovered_events_total{outcome="skipped"} 40`} {
		require.Contains(t, string(body), want)
	}
}

// A monitor of the WAL source reads its relayer's counters through
// WALFigures, and refuses to start without them.
func TestMonitorOfTheWALSourceNeedsItsFigures(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	_, err := monitor.New(monitor.Config{Pool: db.Pool, Tables: db.Tables, Source: ops.WAL("outbox_x")})
	require.ErrorContains(t, err, "WALFigures is nil")
	mon, err := monitor.New(monitor.Config{Pool: db.Pool, Tables: db.Tables, Source: ops.WAL("outbox_x"),
		WALFigures: func() monitor.WALFigures { return monitor.WALFigures{} }})
	require.NoError(t, err)
	require.Nil(t, mon.Metrics(), "the polling relayer's hook has no use for a WAL source")
	mon, err = monitor.New(monitor.Config{Pool: db.Pool, Tables: db.Tables})
	require.NoError(t, err)
	require.NotNil(t, mon.Metrics())
}
