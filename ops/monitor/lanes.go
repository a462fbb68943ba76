package monitor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox/relay"
)

// LaneMetrics count what happens to a relayer's lanes with
// --exactly-once (relay.LaneHook). Metrics hold them; for the WAL source,
// whose other counters are read from the relayer, pass them in the
// relayer's Config.Hooks and in the Lanes of its monitor's Config.
type LaneMetrics struct {
	events, recovered *prometheus.CounterVec
}

var _ relay.LaneHook = (*LaneMetrics)(nil)

// NewLaneMetrics makes the lane counters, on no registry yet: register
// them (they are a prometheus.Collector).
func NewLaneMetrics() *LaneMetrics {
	return &LaneMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_lane_events_total",
			Help: "With --exactly-once, what happened to this relayer's lanes, by event: opened (took a lane, fencing its earlier holders), aborted (a batch's broker transaction was aborted; the batch is retried), lost (another relayer took the lane; this one stepped down).",
		}, []string{"event"}),
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_lane_recovered_events_total",
			Help: "With --exactly-once, events whose fate a relayer settled when it opened a lane, by outcome: published (a committed transaction held them; they stay dispatched), returned (none did; back to pending, polling), skipped (read again from the slot and not sent again, WAL).",
		}, []string{"outcome"}),
	}
}

// OnLane counts what happened to a lane; it is a relay.LaneHook.
func (l *LaneMetrics) OnLane(ev relay.LaneEvent) {
	switch ev.Kind {
	case relay.LaneSkipped:
		l.recovered.WithLabelValues("skipped").Add(float64(ev.Skipped))
		return
	case relay.LaneOpened:
		l.recovered.WithLabelValues("published").Add(float64(ev.Published))
		l.recovered.WithLabelValues("returned").Add(float64(ev.Returned))
	}
	l.events.WithLabelValues(string(ev.Kind)).Inc()
}

// Describe is prometheus.Collector's.
func (l *LaneMetrics) Describe(ch chan<- *prometheus.Desc) {
	l.events.Describe(ch)
	l.recovered.Describe(ch)
}

// Collect is prometheus.Collector's.
func (l *LaneMetrics) Collect(ch chan<- prometheus.Metric) {
	l.events.Collect(ch)
	l.recovered.Collect(ch)
}
