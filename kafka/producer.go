package kafka

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Defaults for producer options that matter to the relayer.
const (
	// DefaultDeliveryTimeout bounds how long a batch waits for the broker
	// before the relayer rolls it back and backs off.
	DefaultDeliveryTimeout = 30 * time.Second
	// DefaultMaxMessageBytes is Kafka's default message.max.bytes.
	DefaultMaxMessageBytes = 1048588
)

// ProducerOptions are the franz-go options a producer of outbox records
// needs (the relayer's, and the consumer's dead-letter producer):
// idempotent writes (on by default in franz-go; the relay's publisher
// client turns them off for one request in flight, kafkapub), the murmur2 key partitioner Kafka's Java client uses, no linger
// (the relayer hands over whole batches and waits), a bounded delivery
// timeout so an outage surfaces as an error, a batch limit that matches
// Kafka's default message.max.bytes, and a request for topic auto-creation
// (what the Java producer asks for by default; the broker's
// auto.create.topics.enable decides).
func ProducerOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.AllowAutoTopicCreation(),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(DefaultDeliveryTimeout),
		// Without this, a record already written to a connection that then
		// dies is never timed out (the client cannot know whether the broker
		// stored it) and the batch waits for the broker to come back,
		// holding its transaction open with no error to count or log. The
		// relayer is at-least-once anyway: it rolls the batch back and sends
		// it again, and a possible duplicate is what consumers dedupe.
		kgo.AllowIdempotentProduceCancellation(),
		kgo.ProducerBatchMaxBytes(DefaultMaxMessageBytes),
		kgo.UnknownTopicRetries(3),
		kgo.MaxBufferedRecords(100_000),
	}
}

// TransactionalProducerOptions are ProducerOptions for a transactional
// producer with transactional id id: idempotent (transactions need it),
// without the cancellation of records in flight (which transactions
// refuse: an abandoned record would leave the transaction's sequence
// unknown), with the broker aborting a transaction left open for timeout.
func TransactionalProducerOptions(id string, timeout time.Duration) []kgo.Opt {
	opts := make([]kgo.Opt, 0, 12)
	opts = append(opts,
		kgo.AllowAutoTopicCreation(),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(DefaultDeliveryTimeout),
		kgo.ProducerBatchMaxBytes(DefaultMaxMessageBytes),
		kgo.UnknownTopicRetries(3),
		kgo.MaxBufferedRecords(100_000),
		kgo.TransactionalID(id),
		kgo.TransactionTimeout(timeout),
	)
	return opts
}
