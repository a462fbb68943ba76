// Package ops keeps an outbox visible and small: the figures behind
// `outbox stats` (ReadStats, ReadLag), the watchdog for stuck rows and the
// lag SLO (Check), retention cleanup (Cleanup), the relay's Prometheus
// metrics, a relay.Hook that counts by topic and error reason (Metrics),
// and a Monitor that runs all of that beside a relayer, with /metrics,
// /healthz and /readyz.
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
// For an outbox relayed from the WAL (package relay/walrelay): the
// slot's figures (ReadWALSlot, ReadWALStats, and WALMonitor, whose
// metrics include the slot's lag in bytes and seconds), cleanup behind
// the slot's confirmed position (CleanupConfig.WALSlot), and the
// database's part of switching an outbox between the two sources without
// losing an event (PrepareSwitchToWAL, PrepareSwitchToPoll, SetupWAL;
// `outbox switch`).
package ops
