// Package e2e holds end-to-end fault tests that run the real `outbox`
// binary as separate processes against the real Postgres and a Kafka-wire
// broker: relayers killed with SIGKILL, the broker going away, database
// connections terminated; for the WAL source (`outbox relay --mode
// wal`), relayers killed, a leader failing over to a standby process, and
// the switch between sources, on a throwaway wal_level=logical cluster
// (internal/tmppg). It has no non-test code.
package e2e
