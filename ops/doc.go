// Package ops keeps an outbox visible and small, for either relay source:
// the figures behind `outbox stats` (ReadStats, ReadLag, and the WAL
// source's slot: ReadWALSlot, SlotName), the watchdog for stuck rows, the
// lag SLO and the slot's health (Check), retention cleanup (Cleanup; for a
// partitioned outbox, partitions made ahead and dropped: EnsurePartitions,
// ListPartitions), and
// the operator's verbs on single events (ShowEvent, Retry, Park, Unpark,
// Replay; `outbox events`), one file each.
//
// A Source says which relay source moves the outbox's rows: Polling (the
// zero value) or WAL(slot). The polling relay marks rows dispatched, so
// the figures and the watchdog read its pending rows; the WAL source never
// does, so they read its replication slot instead (its lag in bytes, its
// wal_status, its reader), and cleanup deletes only what the slot has
// confirmed.
//
// The smallest check, for cron or a probe:
//
//	rep, err := ops.Check(ctx, pool, ops.WatchdogConfig{Tables: tables})
//	if err == nil && !rep.Healthy() {
//		// rep.Stuck lists the stuck rows with their last publish error
//	}
//
// Why a row is stuck is known to the relay process that failed to publish
// it; the relayer records each permanent failure in the <outbox>_failures
// table (migration 2), where Check finds it.
//
// The package links neither Prometheus nor a Kafka client. Beside it:
// ops/monitor runs the metrics, /healthz, /readyz, the gauges' refresh,
// the watchdog and cleanup inside a relay process; ops/switchover moves
// an outbox between the polling and the WAL source without losing an
// event; consumer/consumermetrics serves a consumer's metrics.
package ops
