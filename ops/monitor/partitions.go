package monitor

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox/ops"
)

// DefaultPartitionInterval is how often a monitor of a partitioned outbox
// makes the partitions it needs ahead of the id sequence.
const DefaultPartitionInterval = 10 * time.Minute

// partitionGauges are a partitioned outbox's metrics, registered the first
// time the monitor finds the outbox partitioned: a plain outbox has no
// headroom to alert on. Every replica reads the same figures from the
// database (the headroom, the last retention run's kept partitions); the
// counters count what this process made and dropped.
type partitionGauges struct {
	once                            sync.Once
	count, headroomIDs, headroomSec prometheus.Gauge
	headroomLow                     prometheus.Gauge
	kept                            *prometheus.GaugeVec
	created, dropped                prometheus.Counter
}

// keptReasons are the label values of outbox_partitions_kept.
var keptReasons = []string{ops.KeptPending, ops.KeptHeld, ops.KeptParked, ops.KeptSlotBehind, ops.KeptInFlight}

func (g *partitionGauges) register(reg *prometheus.Registry) {
	g.once.Do(func() {
		gauge := func(name, help string) prometheus.Gauge {
			v := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
			reg.MustRegister(v)
			return v
		}
		counter := func(name, help string) prometheus.Counter {
			v := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
			reg.MustRegister(v)
			return v
		}
		g.count = gauge("outbox_partitions", "Partitions of the partitioned outbox table.")
		g.headroomIDs = gauge("outbox_partition_headroom_ids", "Ids the partitions hold past the id sequence: inserts fail once it reaches 0.")
		g.headroomSec = gauge("outbox_partition_headroom_seconds", "How long the headroom lasts at the ids drawn per second recently (+Inf when none were).")
		g.headroomLow = gauge("outbox_partition_headroom_low", "1 while the headroom is under half of what the partition job keeps (it is not running, may not make tables, or the width is too narrow for the rate), else 0.")
		g.kept = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_partitions_kept",
			Help: "Partitions the last retention run kept past the retention, by reason (pending, held, parked, slot_behind, in_flight)."}, []string{"reason"})
		reg.MustRegister(g.kept)
		g.created = counter("outbox_partitions_created_total", "Partitions this process made ahead of the id sequence.")
		g.dropped = counter("outbox_partitions_dropped_total", "Partitions this process's retention detached and dropped.")
	})
}

// setStatus sets the gauges from a partitioned outbox's status.
func (g *partitionGauges) setStatus(st *ops.PartitionStatus) {
	h := st.Headroom
	g.count.Set(float64(h.Partitions))
	g.headroomIDs.Set(float64(h.IDs))
	left := math.Inf(1)
	if h.Rate > 0 {
		left = h.Left.Seconds()
	}
	g.headroomSec.Set(left)
	g.headroomLow.Set(map[bool]float64{false: 0, true: 1}[h.Low])
	kept := map[string]int{}
	if st.LastRetention != nil {
		for _, k := range st.LastRetention.Kept {
			kept[k.Reason]++
		}
	}
	for _, r := range keptReasons {
		g.kept.WithLabelValues(r).Set(float64(kept[r]))
	}
}

// KeepPartitions makes a partitioned outbox's partitions ahead of its id
// sequence and sets the headroom gauges; Run calls it every
// PartitionInterval, whether or not this process runs cleanup: an insert
// must never wait for a partition. A plain outbox is left alone.
func (m *Monitor) KeepPartitions(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := ops.EnsurePartitions(qctx, m.cfg.Pool, ops.PartitionConfig{Tables: m.cfg.Tables, Logger: m.log})
	switch {
	case errors.Is(err, ops.ErrNotPartitioned):
		return
	case err != nil:
		if ctx.Err() == nil {
			m.log.Warn("could not make the partitions ahead of the id sequence; will retry", "err", err, "next_in", m.cfg.PartitionInterval)
		}
		return
	}
	m.parts.register(m.reg)
	m.parts.created.Add(float64(len(res.Created)))
	st, err := ops.ReadPartitionStatus(qctx, m.cfg.Pool, m.cfg.Tables)
	if err == nil && st != nil {
		m.parts.setStatus(st)
	}
}

// watchPartitions sets the partition gauges from the watchdog's report and
// logs its findings.
func (m *Monitor) watchPartitions(rep ops.Report) {
	if rep.Partitions == nil {
		return
	}
	m.parts.register(m.reg)
	m.parts.setStatus(rep.Partitions)
	for _, p := range rep.Partitions.Problems() {
		m.log.Warn("outbox partitions unhealthy", "problem", p)
	}
}
