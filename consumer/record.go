package consumer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/kafka"
)

// Headers the Consumer adds to a dead-lettered record, after the original
// record's own headers (which it keeps, with its key and value).
const (
	// HeaderDLQError is why the record was dead-lettered: the handler's
	// last error, or what is malformed about the record.
	HeaderDLQError = "dlq_error"
	// HeaderDLQConsumer is the Name of the consumer that gave up on it.
	HeaderDLQConsumer = "dlq_consumer"
	// HeaderDLQAttempts is how many times the handler ran, in decimal; 0
	// for a malformed record, which never reaches a handler.
	HeaderDLQAttempts = "dlq_attempts"
	// HeaderDLQOriginalTopic, HeaderDLQOriginalPartition and
	// HeaderDLQOriginalOffset locate the original record.
	HeaderDLQOriginalTopic     = "dlq_original_topic"
	HeaderDLQOriginalPartition = "dlq_original_partition"
	HeaderDLQOriginalOffset    = "dlq_original_offset"
)

// maxDLQErrorBytes bounds the dlq_error header: a handler error can carry
// a whole response body, and the dead-letter record must still fit the
// broker's message size limit.
const maxDLQErrorBytes = 4 << 10

// malformed is why a record cannot be processed at all.
type malformed struct{ reason string }

func (m *malformed) Error() string { return "malformed record: " + m.reason }

// decode turns a record into an Event, or says why it is malformed.
// Routing (an unknown type) is checked by the caller.
func decode(r *kgo.Record) (Event, *malformed) {
	ev := Event{
		Headers:   make(map[string]string, len(r.Headers)),
		Payload:   r.Value,
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
	}
	for _, h := range r.Headers {
		ev.Headers[h.Key] = string(h.Value)
	}
	rawID, ok := ev.Headers[kafka.HeaderEventID]
	if !ok {
		return ev, &malformed{"no " + kafka.HeaderEventID + " header; records must come from the outbox relayer, or carry the outbox row id in it"}
	}
	id, err := parseEventID(rawID)
	if err != nil {
		return ev, &malformed{err.Error()}
	}
	ev.ID = id
	ev.Type = ev.Headers[kafka.HeaderEventType]
	ev.Source = ev.Headers[kafka.HeaderEventSource]
	if agg, err := uuid.ParseBytes(r.Key); err == nil {
		ev.AggregateID = agg
	}
	if !json.Valid(r.Value) {
		return ev, &malformed{fmt.Sprintf("payload of %d bytes is not valid JSON", len(r.Value))}
	}
	return ev, nil
}

// parseEventID accepts what the relayer writes: a positive decimal int64,
// digits only (no sign, no spaces).
func parseEventID(s string) (int64, error) {
	bad := func() (int64, error) {
		return 0, fmt.Errorf("%s header %q is not a positive decimal integer", kafka.HeaderEventID, truncate(s, 64))
	}
	if s == "" || len(s) > 19 {
		return bad()
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return bad()
		}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return bad()
	}
	return id, nil
}

// deadLetter builds the dead-letter copy of r.
func deadLetter(r *kgo.Record, topic, consumer string, attempts int, reason string) *kgo.Record {
	hdrs := make([]kgo.RecordHeader, 0, len(r.Headers)+6)
	hdrs = append(hdrs, r.Headers...)
	hdrs = append(hdrs,
		kgo.RecordHeader{Key: HeaderDLQError, Value: []byte(truncate(reason, maxDLQErrorBytes))},
		kgo.RecordHeader{Key: HeaderDLQConsumer, Value: []byte(consumer)},
		kgo.RecordHeader{Key: HeaderDLQAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
		kgo.RecordHeader{Key: HeaderDLQOriginalTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderDLQOriginalPartition, Value: strconv.AppendInt(nil, int64(r.Partition), 10)},
		kgo.RecordHeader{Key: HeaderDLQOriginalOffset, Value: strconv.AppendInt(nil, r.Offset, 10)},
	)
	return &kgo.Record{
		Topic:     topic,
		Key:       r.Key,
		Value:     r.Value,
		Headers:   hdrs,
		Timestamp: time.Now(),
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}
