package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/testlog"
)

// Input errors never stall a partition: they are dead-lettered, and only
// a database or broker that is down is waited out.

// calls counts handler calls per event id.
type calls struct{ m sync.Map }

func (c *calls) handler(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
	n, _ := c.m.LoadOrStore(ev.ID, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	return record(ctx, tx, ev)
}

func (c *calls) of(id int64) int64 {
	n, ok := c.m.Load(id)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// An event_source that is not valid UTF-8 made the dedupe insert fail with
// SQLSTATE 22021, which was taken for a database outage and retried
// forever, stalling every partition. It is malformed: dead-lettered at
// once, naming the header.
func TestConsumerDeadLettersSourceNotUTF8(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen calls
	c, err := consumer.New(b.config(map[string]consumer.Handler{"item.ok": seen.handler}))
	require.NoError(t, err)

	bad := event("t", 0, 99002, "item.ok", `{}`, outbox.HeaderEventSource, "bad\xffsrc")
	recs := []*kgo.Record{bad}
	for id := int64(1); id <= 30; id++ {
		recs = append(recs, event("t", int32(id%3), id, "item.ok", `{}`))
	}
	produce(t, b.producer(t), recs...)
	run(t, c)

	require.Eventually(t, func() bool { return len(b.effects(t)) == 30 }, 20*time.Second, 20*time.Millisecond,
		"the events after the bad one, on its partition and the others, are processed")
	for id := int64(1); id <= 30; id++ {
		require.EqualValues(t, 1, seen.of(id), "handler calls for event %d", id)
	}
	require.Zero(t, seen.of(99002))
	dlq := b.read(t, "t.dlq", 1, 10*time.Second)
	require.Len(t, dlq, 1)
	h := headers(dlq[0])
	require.Contains(t, h[consumer.HeaderDLQError], `event_source header "bad\xffsrc" is not valid UTF-8`)
	require.Equal(t, "bad\xffsrc", h[outbox.HeaderEventSource], "the original headers are kept byte for byte")
	require.Equal(t, "0", h[consumer.HeaderDLQAttempts])
	require.Equal(t, "0", h[consumer.HeaderDLQOriginalOffset])
	require.Eventually(t, func() bool { return c.Stats().Processed == 30 }, 5*time.Second, 10*time.Millisecond)
	st := c.Stats()
	require.Equal(t, consumer.Stats{Records: 31, Processed: 30, DeadLettered: 1, Malformed: 1}, st, "nothing was retried")
	require.Equal(t, 30, b.processedRows(t))
}

// Other encodings Postgres cannot store, in the headers the consumer
// stores or routes on and in the payload, are malformed too.
func TestConsumerDeadLettersBadEncodings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen calls
	cfg := b.config(map[string]consumer.Handler{"item.ok": seen.handler})
	cfg.DefaultHandler = seen.handler // so a bad type is not merely unrouted
	c, err := consumer.New(cfg)
	require.NoError(t, err)

	recs := []*kgo.Record{
		event("t", 0, 1, "item.ok", `{}`, outbox.HeaderEventSource, "a\x00b"),
		event("t", 0, 2, "item.\xc3", `{}`),
		event("t", 0, 3, "item\x00ok", `{}`),
		event("t", 0, 4, "item.ok", "\xff\xfe{not json"),
		event("t", 0, 5, "item.ok", "{\"name\":\"\xff\"}"),
		event("t", 0, 6, "item.ok", `{"name":"ok"}`),
	}
	produce(t, b.producer(t), recs...)
	run(t, c)
	wants := []string{
		`event_source header "a\x00b" contains a NUL character`,
		`event_type header "item.\xc3" is not valid UTF-8`,
		`event_type header "item\x00ok" contains a NUL character`,
		"payload of " + strconv.Itoa(len(recs[3].Value)) + " bytes is not valid JSON",
		"payload of " + strconv.Itoa(len(recs[4].Value)) + " bytes is JSON but not valid UTF-8",
	}
	dlq := b.read(t, "t.dlq", len(wants), 20*time.Second)
	require.Len(t, dlq, len(wants))
	for i, r := range dlq {
		require.Contains(t, headers(r)[consumer.HeaderDLQError], wants[i], "dead letter %d", i)
		require.Equal(t, recs[i].Value, r.Value, "dead letter %d keeps the value byte for byte", i)
	}
	require.Eventually(t, func() bool { return len(b.effects(t)) == 1 }, 10*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 1, seen.of(6))
	require.Eventually(t, func() bool { return c.Stats().Malformed == 5 }, 5*time.Second, 10*time.Millisecond)
	require.Zero(t, c.Stats().Retries)
}

// A source that is valid text but that the processed table still refuses
// (too long for its primary key index: SQLSTATE 54000) is the record's
// fault, not an outage: dead-lettered at once, in a batch or alone, and
// the events around it are processed.
func TestConsumerDeadLettersSourceTheTableRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen calls
	c, err := consumer.New(b.config(map[string]consumer.Handler{"item.ok": seen.handler}))
	require.NoError(t, err)

	long := randomText(t, 4000) // incompressible: Postgres cannot shrink it under the index row limit
	recs := []*kgo.Record{event("t", 0, 1, "item.ok", `{}`)}
	recs = append(recs, event("t", 0, 2, "item.ok", `{}`, outbox.HeaderEventSource, long))
	for id := int64(3); id <= 12; id++ {
		recs = append(recs, event("t", int32(id%3), id, "item.ok", `{}`))
	}
	produce(t, b.producer(t), recs...)
	run(t, c)

	require.Eventually(t, func() bool { return len(b.effects(t)) == 11 }, 20*time.Second, 20*time.Millisecond)
	require.Zero(t, seen.of(2))
	dlq := b.read(t, "t.dlq", 1, 10*time.Second)
	require.Len(t, dlq, 1)
	h := headers(dlq[0])
	require.Contains(t, h[consumer.HeaderDLQError], "invalid event")
	require.Contains(t, h[consumer.HeaderDLQError], "SQLSTATE 54000")
	require.Equal(t, "0", h[consumer.HeaderDLQAttempts])
	require.Equal(t, "1", h[consumer.HeaderDLQOriginalOffset])
	require.Eventually(t, func() bool { return c.Stats().Processed == 11 }, 5*time.Second, 10*time.Millisecond)
	st := c.Stats()
	require.Equal(t, consumer.Stats{Records: 12, Processed: 11, DeadLettered: 1}, st, "not malformed, not retried")
}

// The processed table's refusal surfaces from the Processor as
// ErrInvalidEvent, with the server's error.
func TestProcessInvalidSource(t *testing.T) {
	t.Parallel()
	b := dbOnly(t)
	p := b.processor(t, "loyalty")
	ctx := context.Background()
	ev := consumer.Event{ID: 1, Source: "bad\xffsrc", Payload: []byte(`{}`)}
	_, err := p.Process(ctx, ev, record)
	require.ErrorIs(t, err, consumer.ErrInvalidEvent)
	require.ErrorContains(t, err, "SQLSTATE 22021")
	_, err = p.ProcessBatch(ctx, []consumer.Event{{ID: 2, Payload: []byte(`{}`)}, ev}, record)
	require.ErrorIs(t, err, consumer.ErrInvalidEvent)
	require.Zero(t, b.processedRows(t))

	_, err = consumer.NewProcessor(consumer.ProcessorConfig{Name: "bad\xffname", Pool: b.db.Pool})
	require.ErrorContains(t, err, "is not valid UTF-8")
}

// setupLimited is setup with a broker whose records may be at most
// maxBytes (message.max.bytes, the size of a record batch on the wire).
func setupLimited(t *testing.T, maxBytes int) *bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	_, err := db.Pool.Exec(context.Background(),
		`CREATE TABLE effects (source TEXT NOT NULL, event_id BIGINT NOT NULL, type TEXT NOT NULL, n INT NOT NULL DEFAULT 1, PRIMARY KEY (source, event_id))`)
	require.NoError(t, err)
	br, err := devkafka.Start(devkafka.Config{Partitions: 3, Opts: []kfake.Opt{
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(maxBytes)}),
	}})
	require.NoError(t, err)
	t.Cleanup(br.Close)
	return &bundle{db: db, broker: br}
}

// batchSize is the size on the wire of a record batch holding only r,
// uncompressed: what message.max.bytes limits.
func batchSize(r *kgo.Record) int {
	vlen := func(n int) int { return len(binary.AppendVarint(nil, int64(n))) }
	body := 1 + 1 + 1 // attributes, timestamp delta, offset delta
	body += vlen(len(r.Key)) + len(r.Key)
	body += vlen(len(r.Value)) + len(r.Value)
	body += vlen(len(r.Headers))
	for _, h := range r.Headers {
		body += vlen(len(h.Key)) + len(h.Key) + vlen(len(h.Value)) + len(h.Value)
	}
	return 61 + vlen(body) + body
}

// wholeDeadLetter is the dead-letter copy the consumer named "test" writes
// of r, malformed for reason, as far as its size goes.
func wholeDeadLetter(r *kgo.Record, reason string) *kgo.Record {
	dl := &kgo.Record{Key: r.Key, Value: r.Value, Headers: append([]kgo.RecordHeader(nil), r.Headers...)}
	for _, kv := range [][2]string{
		{consumer.HeaderDLQError, "malformed record: " + reason},
		{consumer.HeaderDLQConsumer, "test"},
		{consumer.HeaderDLQAttempts, "0"},
		{consumer.HeaderDLQOriginalTopic, r.Topic},
		{consumer.HeaderDLQOriginalPartition, strconv.Itoa(int(r.Partition))},
		{consumer.HeaderDLQOriginalOffset, "0"},
	} {
		dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: kv[0], Value: []byte(kv[1])})
	}
	return dl
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	p := make([]byte, n)
	_, err := rand.Read(p)
	require.NoError(t, err)
	return p
}

func randomText(t *testing.T, n int) string {
	return base64.RawStdEncoding.EncodeToString(randomBytes(t, n))[:n]
}

// loggedConfig is b.config with the consumer's logs collected, and shown
// when the test fails.
func (b *bundle) loggedConfig(t *testing.T, handlers map[string]consumer.Handler) (consumer.Config, *testlog.Buffer) {
	t.Helper()
	logs := &testlog.Buffer{}
	cfg := b.config(handlers)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log("consumer logs:\n" + logs.String())
		}
	})
	return cfg, logs
}

// A record that fits its topic can have a dead-letter copy that does not:
// the dlq_* headers make it larger. The broker refuses the copy every time,
// which stalled the partition behind it. A pointer record goes instead.
func TestConsumerDeadLetterTooLargeWritesPointer(t *testing.T) {
	t.Parallel()
	const limit = 100_000
	b := setupLimited(t, limit)
	var seen calls
	cfg, logs := b.loggedConfig(t, map[string]consumer.Handler{"item.ok": seen.handler})
	c, err := consumer.New(cfg)
	require.NoError(t, err)

	big := event("t", 0, 1, "item.ok", "")
	const valueLen = 99_702 // the record is 99,870 bytes on the wire
	big.Value = randomBytes(t, valueLen)
	big.Value[0] = 0xff // never JSON
	require.Equal(t, 99_870, batchSize(big))
	reason := "payload of " + strconv.Itoa(valueLen) + " bytes is not valid JSON"
	require.Greater(t, batchSize(wholeDeadLetter(big, reason)), limit, "the test needs a dead-letter copy the broker refuses")

	p := b.producer(t)
	produce(t, p, big)
	produce(t, p,
		event("t", 0, 2, "item.ok", `{}`),
		event("t", 1, 3, "item.ok", `{}`),
		event("t", 2, 4, "item.ok", `{}`),
	)
	run(t, c)

	require.Eventually(t, func() bool { return len(b.effects(t)) == 3 }, 20*time.Second, 20*time.Millisecond,
		"the records after the big one, on its partition and the others, are processed")
	dlq := b.read(t, "t.dlq", 1, 10*time.Second)
	require.Len(t, dlq, 1)
	ptr := dlq[0]
	require.Equal(t, big.Key, ptr.Key)
	require.Empty(t, ptr.Value)
	h := headers(ptr)
	require.Equal(t, strconv.Itoa(valueLen), h[consumer.HeaderDLQValueDropped])
	require.NotContains(t, h, consumer.HeaderDLQHeadersDropped)
	require.Equal(t, "1", h[outbox.HeaderEventID], "the original headers are kept")
	require.Contains(t, h[consumer.HeaderDLQError], reason)
	require.Equal(t, "test", h[consumer.HeaderDLQConsumer])
	require.Equal(t, "t", h[consumer.HeaderDLQOriginalTopic])
	require.Equal(t, "0", h[consumer.HeaderDLQOriginalPartition])
	require.Equal(t, "0", h[consumer.HeaderDLQOriginalOffset])
	want := consumer.Stats{Records: 4, Processed: 3, DeadLettered: 1, Malformed: 1}
	require.Eventually(t, func() bool { return c.Stats() == want }, 5*time.Second, 10*time.Millisecond, "stats %+v, want %+v", c.Stats(), want)
	require.Contains(t, logs.String(), "dead-lettered as a pointer record")
	require.Contains(t, logs.String(), "value_dropped="+strconv.Itoa(valueLen))
	require.Zero(t, seen.of(1))
}

// When even the pointer record is refused (a key nearly as large as the
// topic allows), the dead letter is dropped: logged with the record's
// location, counted, and the partition moves on.
func TestConsumerDeadLetterDroppedWhenPointerRefused(t *testing.T) {
	t.Parallel()
	const limit = 100_000
	b := setupLimited(t, limit)
	var seen calls
	cfg, logs := b.loggedConfig(t, map[string]consumer.Handler{"item.ok": seen.handler})
	c, err := consumer.New(cfg)
	require.NoError(t, err)

	huge := event("t", 0, 1, "item.ok", "x")
	huge.Key = randomBytes(t, limit-150)
	require.LessOrEqual(t, batchSize(huge), limit)
	bare := wholeDeadLetter(&kgo.Record{Key: huge.Key, Topic: "t"}, "payload of 1 bytes is not valid JSON")
	require.Greater(t, batchSize(bare), limit, "the test needs a pointer record the broker refuses")

	p := b.producer(t)
	produce(t, p, huge)
	produce(t, p,
		event("t", 0, 2, "item.ok", `{}`),
		event("t", 1, 3, "item.ok", `{}`),
		event("t", 0, 4, "item.ok", `not json`), // a dead letter that fits, after it
	)
	stop := run(t, c)

	require.Eventually(t, func() bool { return len(b.effects(t)) == 2 }, 20*time.Second, 20*time.Millisecond)
	dlq := b.read(t, "t.dlq", 1, 10*time.Second)
	require.Len(t, dlq, 1, "no dead letter of the huge record")
	require.Equal(t, "2", headers(dlq[0])[consumer.HeaderDLQOriginalOffset])
	// The counters move just after the writes the test saw: wait for them.
	want := consumer.Stats{Records: 4, Processed: 2, DeadLettered: 1, Malformed: 2, DeadLetterDropped: 1}
	require.Eventually(t, func() bool { return c.Stats() == want }, 5*time.Second, 10*time.Millisecond, "stats %+v, want %+v", c.Stats(), want)
	out := logs.String()
	require.Contains(t, out, "dead letter dropped")
	require.Regexp(t, `level=ERROR msg="dead letter dropped[^\n]* topic=t partition=0 offset=0 `, out)

	// Its offset was committed: a new member of the group starts after it.
	require.NoError(t, stop())
	c2, err := consumer.New(cfg)
	require.NoError(t, err)
	run(t, c2)
	produce(t, p, event("t", 0, 5, "item.ok", `{}`))
	require.Eventually(t, func() bool { return len(b.effects(t)) == 3 }, 20*time.Second, 20*time.Millisecond)
	// As above: the counter moves just after the commit the test saw.
	want2 := consumer.Stats{Records: 1, Processed: 1}
	require.Eventually(t, func() bool { return c2.Stats() == want2 }, 5*time.Second, 10*time.Millisecond, "stats %+v, want %+v", c2.Stats(), want2)
}
