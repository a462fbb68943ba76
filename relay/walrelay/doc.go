// Package walrelay is the log-tailing source of the relay (`outbox relay
// --mode wal`): it streams the outbox's committed inserts from a logical
// replication slot (pgoutput) and publishes them with the same records,
// keys, headers and topics as the polling relay (package relay), through
// the same relay.Sink. It never updates a row: no dispatched_at, no
// dead tuple per event, no pending index to churn.
//
//	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{"localhost:9092"}})
//	pub := kafkapub.NewPublisher(client, kafkapub.PublisherConfig{})
//	r, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: pool, Sink: pub}})
//	err = r.Run(ctx) // until ctx is cancelled
//
// It is a relay.Source, configured with the relay.Common every source
// shares: the same Hooks (monitor.Metrics sees its batches and its parked
// events), the same "send <topic>" spans linked to each event's Emit span,
// and the same Stats shape as the polling relay.
//
// The server needs wal_level=logical, and the pool's role the REPLICATION
// attribute. Run creates the publication (FOR TABLE the outbox, publish =
// 'insert') and the slot when this outbox never had them (Setup), and
// marks the publication once the slot exists: a slot that later
// disappears is not created again (that would skip what was committed
// meanwhile), Run fails with ErrSlotLost. Teardown drops both.
//
// # Order and acknowledgement
//
// The WAL hands over transactions in commit order, so events of one
// aggregate are published in commit order even when producers insert by
// plain SQL without Emit's per-aggregate lock. Batches are published one at
// a time, in stream order; the slot is told (standby status update,
// WALFlushPosition) only the end of the last transaction whose every
// record the broker acknowledged, at least every StatusInterval and
// whenever the server asks. A crash at any point loses nothing: the slot
// resends from its confirmed position, so at most the unacknowledged
// transactions are published again (at-least-once; consumers
// deduplicate on event_id). When Run's context is cancelled, the batch out
// is let finish (ShutdownTimeout) and acknowledged before Run returns.
//
// Memory is bounded by BatchSize and MaxBatchBytes: a batch stops before
// the event that would cross either, and the stream is not read on while
// as much waits behind the batch out.
//
// A heartbeat, a non-transactional logical message written every
// HeartbeatInterval,
//
//	SELECT pg_logical_emit_message(false, 'outbox-heartbeat', '')
//
// moves the slot while the outbox is idle and other tables write WAL; it
// is acknowledged once everything before it is.
// Keepalives do the same when nothing is unacknowledged.
//
// # Emit modes
//
// Three ways to write an event (outbox.Config.Mode), all read by this
// source:
//
//   - outbox.ModeInsert, a plain insert (Emit, the SQL emit function,
//     INSERT): rows stay in the table with dispatched_at NULL, which this
//     source never sets. The WAL, not the row, is what gets published;
//     ops.Cleanup (with CleanupConfig.Source, as `outbox cleanup` sets
//     it) deletes rows past retention once the slot has confirmed them,
//     keeping the rows a lost slot's gap would be republished from. With
//     this source only, the producer needs neither the per-aggregate lock
//     nor NOTIFY (outbox.Config.DisableAggregateLock, DisableNotify).
//   - outbox.ModeInsertDelete, insert and delete in the same transaction:
//     the table stays empty; the publication carries inserts only, so the
//     delete is not published.
//   - outbox.ModeMessage, a transactional logical message (MessagePrefix
//     documents the format, for producers outside Go): no table row at
//     all; the event's id comes from the outbox's sequence. Published
//     only with Config.Messages on (see Trust).
//
// The last two leave nothing for the polling relay, nor for a gap to be
// republished from if the slot is lost.
//
// # Poison events
//
// A record the broker refuses for good (too large, invalid topic, not
// authorised), that the relayer cannot decode (headers that are not an
// object of strings), or that breaks its contract (Common.Contracts) is
// parked: moved to the outbox's _parked table with
// the reason, logged with the command to unpark it, counted (Stats.Parked),
// and the stream goes on. The slot cannot skip one event and keep the
// rest: holding the stream until an operator acts would hold every
// aggregate and keep WAL on disk, which is how slots fill disks. The
// price is the one of `outbox events park`: later events of the same
// aggregate are published without the parked one. Unparking inserts it
// again, which publishes it (after them), or parks it again if it still
// breaks its contract. Transient failures (broker
// down) are retried in order with backoff for as long as they last. A
// topic the broker does not know is retried for UnknownTopicGrace before
// the event is parked, so that creating the topic in time loses nothing;
// a type that makes no valid topic name is parked at once. An event the
// parked table refuses too (a data error, SQLSTATE class 22) is dropped
// and logged (Stats.Dropped).
//
// # High availability
//
// Several relayers may run against one slot. The leader holds a session
// advisory lock (internal/lockkey.WALSlot) on its own connection; the
// others try it every LeaderPollInterval and take over within about that
// long once the leader's session ends (kill -9, a lost network). A leader
// whose lock session dies stops streaming at once, so two never stream.
// The server notices a leader cut off by the network within about 25s
// (TCP keepalives and tcp_user_timeout on both of its sessions), which
// releases the lock and the slot. A new leader that finds the slot still
// read by the old leader's stream (application_name "outbox-wal stream")
// steps down and tries again until the server has ended it.
//
// # Trust
//
// Only what the producers' role commits becomes an event, and ids belong
// to the outbox (its sequence), never to the writer. Any role that can
// execute pg_logical_emit_message can write a message with any prefix and
// any id in it, and Postgres grants it to PUBLIC; so messages with the
// outbox's prefix are events only with Config.Messages on. Producers then
// write them through <outbox>_emit_message (migration 7; EmitMessageFunc),
// a SECURITY DEFINER function that draws the id from the outbox's
// sequence, and they are granted EXECUTE on it alone. Run refuses to start
// (ErrMessagesOpen, naming the roles and saying what to run) while any role
// other than superusers, the relay's own (it writes heartbeats) and that
// function's owner, and their members, can execute pg_logical_emit_message:
// PUBLIC, or any role, login or not (a NOINHERIT login role can SET ROLE to
// one that can), INSERT on the outbox or not (CheckMessages;
// SecureMessages revokes it from PUBLIC). Function privileges are per
// database: the REVOKE is needed in each database. A message's created_at
// is ignored: an event's time is its commit's. A
// non-transactional message is never an event (it is written whether or
// not its transaction commits), nor one whose transaction rolled back
// (pgoutput never sends it). Messages that are no event are dropped,
// logged and counted (Stats.Dropped).
//
// # Safety
//
// Run fails with one line saying what to do when wal_level is not logical
// (ErrWALLevel), when the slot was invalidated (ErrSlotLost), when
// another process reads the slot (ErrSlotBusy), when the slot is another
// database's or the publication does not publish exactly this outbox's
// table (ErrNotThisOutbox, before anything is streamed), or when, left to
// the defaults, the outbox's slot has an earlier version's default name
// (ErrLegacySlot; Names resolves it); it warns at start when
// max_slot_wal_keep_size is unlimited. Lag reads the slot's lag in bytes
// from any session; Relayer.Lag is the leader's lag in time.
package walrelay
