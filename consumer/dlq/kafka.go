package dlq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/kafka"
)

// Kafka is the Store of the Kafka consumer's dead-letter topics.
type Kafka struct {
	cfg    kafka.ClientConfig
	client *kgo.Client
}

var _ Store = (*Kafka)(nil)

// NewKafka connects to the cluster cfg names (lazily: the first List or
// Replay dials).
func NewKafka(cfg kafka.ClientConfig) (*Kafka, error) {
	opts, err := cfg.Options()
	if err != nil {
		return nil, fmt.Errorf("dlq: %w", err)
	}
	cl, err := kgo.NewClient(append(kafka.ProducerOptions(), opts...)...)
	if err != nil {
		return nil, fmt.Errorf("dlq: %w", err)
	}
	return &Kafka{cfg: cfg, client: cl}, nil
}

// Close closes the client.
func (k *Kafka) Close() { k.client.Close() }

// List reads the dead-letter topic dest from its start (what retention
// kept) to its end as List was called, partition by partition.
func (k *Kafka) List(ctx context.Context, dest string) ([]Letter, error) {
	adm := kadm.NewClient(k.client)
	starts, err := adm.ListStartOffsets(ctx, dest)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: cannot read the offsets of %s: %w (is it the dead-letter topic's name, <topic>.dlq by default?)", dest, err)
	}
	ends, err := adm.ListEndOffsets(ctx, dest)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: cannot read the offsets of %s: %w", dest, err)
	}
	parts := map[int32]kgo.Offset{}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(o.Topic, o.Partition); ok && o.Offset > s.Offset {
			parts[o.Partition] = kgo.NewOffset().At(s.Offset)
			want[o.Partition] = o.Offset
		}
	})
	if len(parts) == 0 {
		return nil, nil
	}
	return k.read(ctx, dest, parts, want)
}

// read consumes dest's partitions from parts up to want (exclusive).
func (k *Kafka) read(ctx context.Context, dest string, parts map[int32]kgo.Offset, want map[int32]int64) ([]Letter, error) {
	opts, err := k.cfg.Options()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{dest: parts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(200*time.Millisecond))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	byPart := map[int32][]Letter{}
	// A partition's last offsets may hold no record to read (transaction
	// markers): after quietPolls polls in a row that bring nothing, the
	// reader is at the end.
	const quietPolls = 3
	for quiet := 0; len(want) > 0 && quiet < quietPolls; {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("dlq: reading %s: %w", dest, err)
		}
		if fs.NumRecords() == 0 {
			quiet++
		} else {
			quiet = 0
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = errors.Join(ferr, err)
			}
		})
		if ferr != nil {
			return nil, fmt.Errorf("dlq: reading %s: %w", dest, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := want[r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			byPart[r.Partition] = append(byPart[r.Partition], fromRecord(r))
			if r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	var out []Letter
	for _, p := range slices.Sorted(maps.Keys(byPart)) {
		out = append(out, byPart[p]...)
	}
	return out, nil
}

// fromRecord reads a dead-letter record.
func fromRecord(r *kgo.Record) Letter {
	l := Letter{Destination: r.Topic, Position: fmt.Sprintf("%d/%d", r.Partition, r.Offset), Key: r.Key, Payload: r.Value}
	for _, h := range r.Headers {
		v := string(h.Value)
		switch h.Key {
		case consumer.HeaderDLQError:
			l.Error = v
		case consumer.HeaderDLQConsumer:
			l.Consumer = v
		case consumer.HeaderDLQAttempts:
			l.Attempts = atoi(v)
		case consumer.HeaderDLQOriginalTopic:
			l.OriginalTopic = v
		case consumer.HeaderDLQValueDropped:
			l.ValueDropped = atoi(v)
		case consumer.HeaderDLQHeadersDropped:
			l.HeadersDropped = atoi(v)
		case consumer.HeaderDLQOriginalPartition, consumer.HeaderDLQOriginalOffset:
		default:
			l.Headers = append(l.Headers, Header{h.Key, v})
			l.readEventHeader(h.Key, v)
		}
	}
	return l
}

// readEventHeader notes the event's own headers; the first of a repeated
// one is the relayer's, as the consumer reads it.
func (l *Letter) readEventHeader(key, v string) {
	switch key {
	case outbox.HeaderEventID:
		if l.EventID == 0 {
			l.EventID, _ = strconv.ParseInt(v, 10, 64)
		}
	case outbox.HeaderEventType:
		if l.Type == "" {
			l.Type = v
		}
	case outbox.HeaderEventSource:
		if l.Source == "" {
			l.Source = v
		}
	}
}

// Replay produces each letter to its original topic with its key (so to
// its aggregate's partition), payload and headers, in order, and waits for
// the broker's acknowledgement of each.
func (k *Kafka) Replay(ctx context.Context, letters []Letter) (int, error) {
	for _, l := range letters {
		if err := l.Replayable(); err != nil {
			return 0, err
		}
	}
	for i, l := range letters {
		r := &kgo.Record{Topic: l.OriginalTopic, Key: l.Key, Value: l.Payload}
		for _, h := range l.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
		}
		if err := k.client.ProduceSync(ctx, r).FirstErr(); err != nil {
			return i, fmt.Errorf("dlq: replaying %s of %s to %s: %w", l.Position, l.Destination, l.OriginalTopic, err)
		}
	}
	return len(letters), nil
}
