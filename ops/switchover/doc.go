// Package switchover does the database's part of moving an outbox
// between the polling relay and the WAL source without losing an event
// (`outbox switch`): SetupWAL creates the publication and the slot,
// PrepareSwitchToWAL waits until the polling relayers have dispatched
// every row up to the cut, PrepareSwitchToPoll marks dispatched what the
// slot has confirmed. Stopping one source and starting the other, in that
// order, is the operator's part.
package switchover
