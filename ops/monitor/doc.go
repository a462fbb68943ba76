// Package monitor is what a relay process runs beside its relayer, for
// either source: Prometheus metrics (Metrics, a relay hook for the
// polling relayer; the WAL relayer's counters through
// Config.WALFigures, and its slot's state), /metrics, /healthz and
// /readyz, the gauges' refresh, the periodic watchdog (ops.Check) and
// retention cleanup (ops.Cleanup).
//
//	mon, err := monitor.New(monitor.Config{Pool: pool, Tables: tables})
//	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Tables: tables, Sink: pub, Hooks: []relay.Hook{mon.Metrics()}}})
//	go mon.Run(ctx)
//	go http.ListenAndServe("127.0.0.1:9090", mon.Handler())
//
// For an outbox relayed from the WAL, say so with Config.Source
// (ops.WAL(slot)) and pass the relayer's counters in Config.WALFigures.
package monitor
