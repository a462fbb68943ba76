// Package outbox is the producer side of a transactional outbox on
// Postgres: it writes events into the events_outbox table inside the
// caller's own transaction, so an event exists if and only if the business
// write that emitted it committed. A separate relayer (package relay, or the
// `outbox relay` command) publishes committed events to Kafka in order per
// aggregate; consumers deduplicate by event id (package consumer).
//
// The smallest working use, inside a pgx transaction:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total_cents) VALUES ($1, $2)", id, 1999); err != nil {
//			return err
//		}
//		_, err := outbox.Emit(ctx, tx, outbox.Event{
//			AggregateID: id,
//			Type:        "order.placed", // topic "order"
//			Payload:     map[string]any{"order_id": id, "total_cents": 1999},
//		})
//		return err
//	})
//
// Emit and EmitBatch take a pgx.Tx, and EmitSQL and EmitBatchSQL a
// *sql.Tx, rather than anything that can run a query: given a pool, the
// insert would commit on its own, and an event could be published for a
// business write that rolled back.
//
// Create the tables first with `outbox migrate up` (or package migrate).
// QueueEmit does the same on a pgx.Batch, so the event travels with the
// business statements and costs no round trip of its own.
//
// # Wake-up
//
// A Producer sends a NOTIFY that wakes idle relayers at commit, at most
// once per Config.NotifyInterval (10 ms): Postgres makes notifying commits
// wait for each other. A woken relayer keeps claiming while it finds rows,
// which picks up the events committed between two notifications.
//
// # Order
//
// Emit takes a transaction-scoped advisory lock on the event's aggregate
// (hashed into Config.LockBuckets keys, in a namespace of its own) before it
// draws the row's id, so a second transaction emitting for the same
// aggregate waits until the first commits: per aggregate, id order is commit
// order, which is the order the relayer publishes in. A transaction that
// emits for several aggregates through separate Emit calls in different
// orders can deadlock with another doing the reverse, like any row locks:
// Postgres aborts one of them and the caller retries it. EmitBatch takes its
// locks in sorted order and cannot deadlock with another EmitBatch.
// Applications that need no per-aggregate order can set
// Config.DisableAggregateLock.
//
// # Validation
//
// Emit checks every event before anything is sent to the database and
// returns a typed error (ErrEmptyType, ErrNilAggregate, ErrInvalidType,
// ErrInvalidPayload, ErrPayloadTooLarge, ErrInvalidTopic, ErrInvalidHeaders)
// that says what to fix; the caller's transaction is left untouched. It
// refuses what Postgres would refuse, which would abort the transaction,
// and what the sink would refuse, as Config.Routing says: a type with no
// destination, an event over the sink's size limit (with the default Kafka
// routing, a record over Config.MaxRecordBytes as the broker will see it;
// see Event).
package outbox
