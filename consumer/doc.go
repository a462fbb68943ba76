// Package consumer turns at-least-once delivery into exactly-once effects.
//
// The core is the Processor, which knows nothing about brokers: for each
// event it opens a transaction, inserts (consumer, source, event_id) into
// the processed table with ON CONFLICT DO NOTHING and, only if that row is
// new, runs the handler with the same transaction, then commits. The dedupe
// row and the handler's writes commit or roll back together, so an event
// delivered any number of times changes the database once per consumer
// name. ProcessBatch does the same for many events in one transaction;
// ProcessBatchFunc gives their fresh events to one BatchHandler, which can
// write all their effects in one statement.
//
// The Dispatcher is what every transport's consumer shares, on top of the
// Processor: it decodes a Delivery (a message as any transport received
// it) into an Event, routes it to its handler, retries a failing handler
// with backoff, waits out a database outage, and returns a Verdict: Done
// (acknowledge), DeadLetter (write it to the transport's dead-letter
// place, then acknowledge) or Stopped (leave it for redelivery). The
// consumers of the other sinks are built on it, and so is the Consumer.
//
// The Consumer runs the Processor behind a Kafka group consumer (franz-go):
// it routes records to handlers by their event_type header, commits a
// partition's offset only past records whose transaction committed, retries
// failing handlers with capped exponential backoff, and then writes the
// record to a dead-letter topic (<topic>.dlq by default) with the original
// key, value and headers plus dlq_error, dlq_consumer, dlq_attempts,
// dlq_original_topic, dlq_original_partition and dlq_original_offset.
// Malformed records (no event_id header, an event_id that is not a positive
// decimal, an event_source or event_type that is not valid UTF-8 or holds
// NUL, a payload that is not JSON or not UTF-8, a type with no handler) are
// dead-lettered at once, and so is a record whose (source, event_id) the
// processed table refuses (ErrInvalidEvent). Only a database or broker that
// is down is waited out without limit. A topic deleted and recreated (or a
// broker replaced by one that lost its state) has a new id, which franz-go
// refuses until the topic is purged: the Consumer purges it, commits the
// first offset of each of the new topic's partitions, so that no offset
// committed for the old topic (Kafka before 4.2 takes commits by topic
// name) skips the new topic's first records, and reads the new topic from
// its start; events another member already processed are skipped as
// duplicates. The old topic's records that come with the new id's first
// error are processed, and their offsets never committed. A dead-lettered event is not
// recorded as processed: replayed to its topic once the cause is fixed, it
// is processed then. Offsets move past a dead-lettered record only after
// the broker acknowledged its dead-letter copy. When the broker refuses
// the copy for good (the dlq_* headers make it too large), a pointer
// record goes instead: the key, an empty value, the dlq_* headers and
// dlq_value_dropped, without the original headers too (dlq_headers_dropped)
// if need be. If even that is refused, the dead letter is dropped, logged
// and counted (Stats.DeadLetterDropped), and the consumer moves on.
//
// # Event sources
//
// An event's id is the id of its row in one outbox table, so it is unique
// only within that table: two producing databases both emit an event 42. A
// consumer that reads both must not take the second 42 for a duplicate of
// the first. The dedupe key is therefore (consumer, source, event_id):
// run each outbox's relayer with its own source name (relay --source,
// kafkapub.PublisherConfig.Source), which it stamps on every record as the
// event_source header, and the consumer makes it part of the key. Records
// without the header have source "", which is correct as long as they all
// come from one outbox. Give the sources before the second producer
// appears: renaming a source later makes its old events look new.
//
// # Contract versions
//
// An event carries the version of its type's contract in its
// event_version header (Event.Version). Upcasters.Want makes a handler
// read one version: older events are upcast step by step by the
// Upcasters registered, and of an event the producer wrote in several
// versions at once (outbox.EmitVersions, the event_versions header) one
// row is applied and the others skipped. What cannot be read as that
// version is dead-lettered with a reason that says what to do.
//
// # Usage
//
//	c, err := consumer.New(consumer.Config{
//		Name:   "loyalty",
//		Pool:   pool,
//		Client: kafka.ClientConfig{Brokers: []string{"localhost:9092"}},
//		Topics: []string{"order"},
//		Handlers: map[string]consumer.Handler{
//			"order.placed": consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev consumer.Event, o OrderPlaced) error {
//				_, err := tx.Exec(ctx, "UPDATE ...", o.CustomerID)
//				return err
//			}),
//		},
//	})
//	err = c.Run(ctx) // until ctx is cancelled
package consumer
