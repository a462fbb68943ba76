package consumer

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/clip"
)

// dlqWriteTimeout bounds one dead-letter write, in case the broker neither
// acknowledges nor refuses it.
const dlqWriteTimeout = 30 * time.Second

// dlqForm is how much of the original record a dead letter carries.
type dlqForm int

const (
	// whole: the original key, value and headers, plus the dlq_* headers.
	whole dlqForm = iota
	// pointer: the original key and headers, an empty value, the dlq_*
	// headers and dlq_value_dropped.
	pointer
	// barePointer: the original key, an empty value, the dlq_* headers,
	// dlq_value_dropped and dlq_headers_dropped.
	barePointer
)

// smaller is the next form to try for r when the broker refused this one
// for good, skipping forms that would drop nothing more; false when there
// is none.
func (f dlqForm) smaller(r *kgo.Record) (dlqForm, bool) {
	if f == whole && len(r.Value) > 0 {
		return pointer, true
	}
	if f < barePointer && len(r.Headers) > 0 {
		return barePointer, true
	}
	return f, false
}

// deadLetter writes the dead-letter record of r and waits for the broker's
// acknowledgement, retrying until it gets one or stop is cancelled. It
// reports whether the record is now done.
//
// A broker outage is waited out. A refusal that a retry cannot change (the
// copy is too large once the dlq_* headers are added, or invalid) is not
// retried: a smaller pointer record goes instead, without the value, then
// without the original headers too. If even that is refused (a key too
// large for the topic), the dead letter is dropped, logged and counted, and
// the record is done: a partition never stops behind a permanent refusal.
func (c *Consumer) deadLetter(stop, work context.Context, r *kgo.Record, attempts int, reason string) bool {
	topic := c.dlq[r.Topic]
	log := c.log.With("topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "dlq_topic", topic)
	form := whole
	for failures := 1; stop.Err() == nil; {
		// Bounded by stop, not only work: a write cut short is not
		// acknowledged, so the offset stays and the record comes again
		// (its dead letter may then be written twice).
		ctx, cancel := context.WithTimeout(stop, dlqWriteTimeout)
		err := c.dlqCl.ProduceSync(ctx, deadLetterRecord(r, topic, c.cfg.Name, attempts, reason, form)).FirstErr()
		cancel()
		if err == nil {
			c.deadLettered.Add(1)
			switch form {
			case whole:
				log.Warn("record dead-lettered", "attempts", attempts, "reason", reason)
			case pointer:
				log.Warn("record dead-lettered as a pointer record: the broker refused the whole copy, so its value was dropped (read it at the original offset)",
					"attempts", attempts, "reason", reason, "value_dropped", len(r.Value))
			default:
				log.Warn("record dead-lettered as a pointer record: the broker refused the whole copy and the copy without the value, so its value and headers were dropped (read them at the original offset)",
					"attempts", attempts, "reason", reason, "value_dropped", len(r.Value), "headers_dropped", len(r.Headers))
			}
			return true
		}
		if stop.Err() != nil {
			return false
		}
		if refused(err) {
			if next, ok := form.smaller(r); ok {
				log.Warn("the broker refuses the dead-letter record; writing a smaller pointer record instead", "err", err)
				form = next
				continue
			}
			c.deadLetterDropped.Add(1)
			log.Error("dead letter dropped: the broker refuses even a pointer record with only the key and the dlq_* headers; moving past the record without one (if err says too large, the key is: raise the dead-letter topic's max.message.bytes to keep such records)",
				"attempts", attempts, "reason", reason, "key_bytes", len(r.Key), "value_bytes", len(r.Value), "headers", len(r.Headers), "err", err)
			return true
		}
		if errors.Is(err, kerr.UnknownTopicID) {
			// The dead-letter topic was recreated (or the broker replaced):
			// the client keeps its old id until it forgets the topic.
			c.dlqCl.PurgeTopicsFromClient(topic)
		}
		d := backoff.Delay(c.cfg.BackoffMin, c.cfg.BackoffMax, failures)
		log.Error("dead-letter write failed; retrying (the record's offset is not committed until it succeeds)",
			"err", err, "retry_in", d.Round(time.Millisecond))
		if !backoff.Sleep(stop, d) {
			return false
		}
		failures++
	}
	return false
}

// deadLetterRecord builds the dead-letter record of r in the given form.
func deadLetterRecord(r *kgo.Record, topic, consumer string, attempts int, reason string, form dlqForm) *kgo.Record {
	dl := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Timestamp: time.Now()}
	hdrs := make([]kgo.RecordHeader, 0, len(r.Headers)+8)
	if form != barePointer {
		hdrs = append(hdrs, r.Headers...)
	}
	hdrs = append(hdrs,
		kgo.RecordHeader{Key: HeaderDLQError, Value: []byte(clip.Text(reason, maxDLQErrorBytes))},
		kgo.RecordHeader{Key: HeaderDLQConsumer, Value: []byte(consumer)},
		kgo.RecordHeader{Key: HeaderDLQAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
		kgo.RecordHeader{Key: HeaderDLQOriginalTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderDLQOriginalPartition, Value: strconv.AppendInt(nil, int64(r.Partition), 10)},
		kgo.RecordHeader{Key: HeaderDLQOriginalOffset, Value: strconv.AppendInt(nil, r.Offset, 10)},
	)
	if form != whole && len(r.Value) > 0 {
		// Empty, not nil: a null value is a tombstone, which would delete
		// earlier dead letters of the key were the topic compacted.
		dl.Value = []byte{}
		hdrs = append(hdrs, kgo.RecordHeader{Key: HeaderDLQValueDropped, Value: strconv.AppendInt(nil, int64(len(r.Value)), 10)})
	}
	if form == barePointer && len(r.Headers) > 0 {
		hdrs = append(hdrs, kgo.RecordHeader{Key: HeaderDLQHeadersDropped, Value: strconv.AppendInt(nil, int64(len(r.Headers)), 10)})
	}
	dl.Headers = hdrs
	return dl
}
