// Package lockkey derives every advisory-lock key the outbox takes, in one
// place, so that no two of them can be chosen apart and collide:
//
//   - Emit's per-aggregate locks, two-key (int4, int4): Emit(table) and the
//     aggregate's bucket (Bucket);
//   - the migration lock, one bigint key: Migration(table);
//   - the cleanup lock, two-key: Cleanup(table) and CleanupID;
//   - the WAL relay's leader lock, two-key: WALSlot(slot) and WALSlotID.
//
// Each namespace is fixed per outbox table (schema and name), so several
// outboxes in one database never wait on each other, and hashed with a
// prefix of its own, so Emit's and cleanup's do not meet. Postgres keeps
// single-bigint and two-int4 advisory locks apart, so the migration lock
// cannot meet either. An application's own advisory locks are usually
// single-key, and so cannot meet the two-key ones.
package lockkey

import (
	"fmt"
	"hash/fnv"
)

// Emit is the first key of the locks Emit takes; the second is Bucket.
func Emit(schema, outbox string) int32 {
	return int32(Hash32("outbox-emit:" + schema + "." + outbox))
}

// Bucket is the second key of the lock Emit takes for an aggregate: its id
// hashed into buckets keys, which bounds how many locks a batch takes.
func Bucket(aggregateID [16]byte, buckets int) int32 {
	return int32(Hash32(string(aggregateID[:])) % uint32(buckets))
}

// NotifyBucket is the second key of the lock the SQL emit function
// (migration 5) tries, in Emit's namespace, to choose which of the
// transactions emitting at one time sends the NOTIFY: Bucket's keys are
// 0..buckets-1, so it meets no aggregate's lock.
const NotifyBucket = -1

// Channel is the LISTEN/NOTIFY channel of one outbox table.
func Channel(schema, outbox string) string {
	return fmt.Sprintf("outbox_%08x", Hash32(schema+"."+outbox))
}

// Migration is the key of the lock migrations serialise on: Emit's
// namespace in the high half, "mig" in the low.
func Migration(schema, outbox string) int64 {
	return int64(Emit(schema, outbox))<<32 | 0x6d6967 // "mig"
}

// CleanupID is the second key of the cleanup lock.
const CleanupID = 1

// Cleanup is the first key of the cleanup lock, held while one process
// cleans an outbox; the second is CleanupID.
func Cleanup(schema, outbox string) int32 {
	return int32(Hash32("outbox-ops:" + schema + "." + outbox))
}

// WALSlotID is the second key of the WAL relay's leader lock.
const WALSlotID = 2

// WALSlot is the first key of the session lock the leader of the WAL
// relayers reading a replication slot holds; the second is WALSlotID. It
// is keyed by the slot, not the outbox: a slot has one reader at a time,
// whichever outbox it serves.
func WALSlot(slot string) int32 {
	return int32(Hash32("outbox-wal-slot:" + slot))
}

// Hash32 is FNV-1a, the hash every key (and the NOTIFY channel) is derived
// with.
func Hash32(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}
