// Package kafkatest reads back, in tests, what was published to a broker:
// every record of some topics from their start, until the test has what it
// waits for.
package kafkatest

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
)

// Read polls topics on the broker at addr from their start and returns
// every record read once done, called after each poll with all records so
// far, returns true. It fails t when done has not returned true within
// timeout. Records of one partition are in offset order.
func Read(t testing.TB, addr string, timeout time.Duration, done func([]*kgo.Record) bool, topics ...string) []*kgo.Record {
	t.Helper()
	return read(t, addr, timeout, done, topics, kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
}

// ReadCommitted is Read with read_committed isolation: records of open or
// aborted transactions are never returned.
func ReadCommitted(t testing.TB, addr string, timeout time.Duration, done func([]*kgo.Record) bool, topics ...string) []*kgo.Record {
	t.Helper()
	return read(t, addr, timeout, done, topics, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
}

func read(t testing.TB, addr string, timeout time.Duration, done func([]*kgo.Record) bool, topics []string, isolation kgo.Opt) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topics...), isolation,
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	var out []*kgo.Record
	deadline := time.Now().Add(timeout)
	for !done(out) {
		if time.Now().After(deadline) {
			require.FailNowf(t, "not enough records", "read %d records of %s within %s without getting what the test waits for",
				len(out), strings.Join(topics, ","), timeout)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// AtLeast is a done condition: n records or more.
func AtLeast(n int) func([]*kgo.Record) bool {
	return func(rs []*kgo.Record) bool { return len(rs) >= n }
}

// AtLeastThenQuiet is a done condition: n records or more, and then no new
// record for quiet, so that late duplicates are read too.
func AtLeastThenQuiet(n int, quiet time.Duration) func([]*kgo.Record) bool {
	last, since := -1, time.Now()
	return func(rs []*kgo.Record) bool {
		if len(rs) != last {
			last, since = len(rs), time.Now()
		}
		return len(rs) >= n && time.Since(since) >= quiet
	}
}

// Headers returns a record's headers as a map (the last value of a
// repeated key wins).
func Headers(r *kgo.Record) map[string]string {
	h := make(map[string]string, len(r.Headers))
	for _, kv := range r.Headers {
		h[kv.Key] = string(kv.Value)
	}
	return h
}

// EventID returns the record's event_id header, 0 when it is missing or
// not a number.
func EventID(r *kgo.Record) int64 {
	for _, h := range r.Headers {
		if h.Key == outbox.HeaderEventID {
			id, _ := strconv.ParseInt(string(h.Value), 10, 64)
			return id
		}
	}
	return 0
}

// Record is a record read back, in the terms tests check it by.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	Value     string
	Headers   map[string]string
	EventID   int64
}

// Collect reads every record of topics from their start until want
// records arrived, or fails t after timeout. Records arriving in a short
// quiet period after that are included, so duplicates are seen.
func Collect(t testing.TB, addr string, want int, timeout time.Duration, topics ...string) []Record {
	t.Helper()
	var out []Record
	for _, r := range Read(t, addr, timeout, AtLeastThenQuiet(want, 300*time.Millisecond), topics...) {
		out = append(out, Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: string(r.Key), Value: string(r.Value),
			Headers: Headers(r), EventID: EventID(r)})
	}
	return out
}

// CheckOrder asserts that each key lives in exactly one partition and
// that, per key, the first delivery of each event comes in ascending
// rank (the aggregate's commit order: the event id where ids follow it).
// That is the order a deduplicating consumer applies events in:
// at-least-once re-sends (a suffix delivered again) pass, an event whose
// first delivery comes after a later event's does not.
func CheckOrder(t testing.TB, recs []Record, rank func(eventID int64) int64) {
	t.Helper()
	partOf := map[string]int32{}
	byPart := map[int32][]Record{}
	for _, r := range recs {
		if p, ok := partOf[r.Key]; ok {
			require.Equal(t, p, r.Partition, "key %s in two partitions", r.Key)
		}
		partOf[r.Key] = r.Partition
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	seen := map[int64]bool{}
	last := map[string]Record{} // per key, the latest first delivery
	for _, rs := range byPart {
		slices.SortFunc(rs, func(a, b Record) int { return int(a.Offset - b.Offset) })
		for _, r := range rs {
			if seen[r.EventID] {
				continue
			}
			seen[r.EventID] = true
			if prev, ok := last[r.Key]; ok && rank(r.EventID) < rank(prev.EventID) {
				require.Failf(t, "per-aggregate order broken",
					"aggregate %s: event %d (rank %d) first arrived at offset %d of partition %d, after event %d (rank %d) at offset %d",
					r.Key, r.EventID, rank(r.EventID), r.Offset, r.Partition, prev.EventID, rank(prev.EventID), prev.Offset)
			}
			last[r.Key] = r
		}
	}
}

// FreeAddr returns a loopback address nothing listens on right now: where
// a broker is to be started, stopped and started again (the same address,
// as a replaced broker has), or none at all.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}
