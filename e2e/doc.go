// Package e2e holds end-to-end fault tests that run the real `outbox`
// binary as separate processes against the real Postgres and a Kafka-wire
// broker: relayers killed with SIGKILL, the broker going away, database
// connections terminated. It has no non-test code.
package e2e
