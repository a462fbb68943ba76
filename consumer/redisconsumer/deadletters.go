package redisconsumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer/dlq"
	"github.com/pgoutbox/outbox/routing"
)

// listPage is how many entries one XRANGE of List reads.
const listPage = 500

// DeadLetters is the dlq.Store of the consumer's dead-letter streams
// (<stream>:dlq by default).
//
// List reads a dead-letter stream with XRANGE, in entry-id order, from
// its first entry to the last one it had when List was called: it
// consumes nothing and changes nothing (no consumer group is involved).
// Replay adds each letter back to the stream it was dead-lettered from
// (its dlq_stream field) with XADD, with the entry's own fields and none
// of the dead-letter ones, as a new entry at the stream's end. The dead
// letter stays in the dead-letter stream, as on Kafka: replaying it again
// is harmless, consumers skip an event they processed as a duplicate;
// trim the dead-letter stream yourself (XTRIM, XDEL) once done with it.
// The dead letter records neither the consumer's name nor the attempts,
// so a Letter's Consumer is empty and its Attempts 0; its Error is the
// dlq_reason field.
type DeadLetters struct {
	client *redis.Client
}

var _ dlq.Store = (*DeadLetters)(nil)

// NewDeadLetters reads and replays dead letters through client, which
// DeadLetters owns from then on: Close closes it.
func NewDeadLetters(client *redis.Client) (*DeadLetters, error) {
	if client == nil {
		return nil, errors.New("redisconsumer: NewDeadLetters: client is nil; pass a *redis.Client for the server the consumer reads")
	}
	return &DeadLetters{client: client}, nil
}

// Close closes the client.
func (d *DeadLetters) Close() { d.client.Close() }

// List returns the entries of the dead-letter stream dest, oldest first.
// A dest that does not exist holds no dead letters (the consumer creates
// it with its first one); a key that is not a stream is an error.
func (d *DeadLetters) List(ctx context.Context, dest string) ([]dlq.Letter, error) {
	kind, err := d.client.Type(ctx, dest).Result()
	if err != nil {
		return nil, fmt.Errorf("redisconsumer: reading %s: %w", dest, err)
	}
	switch kind {
	case "none":
		return nil, nil
	case "stream":
	default:
		return nil, fmt.Errorf("redisconsumer: %s is a Redis %s, not a stream; name the dead-letter stream, <stream>:dlq by default (e.g. order:dlq)", dest, kind)
	}
	last, err := d.client.XRevRangeN(ctx, dest, "+", "-", 1).Result()
	if err != nil {
		return nil, fmt.Errorf("redisconsumer: reading %s: %w", dest, err)
	}
	if len(last) == 0 {
		return nil, nil
	}
	end := last[0].ID
	var out []dlq.Letter
	for start := "-"; ; {
		page, err := d.client.XRangeN(ctx, dest, start, end, listPage).Result()
		if err != nil {
			return nil, fmt.Errorf("redisconsumer: reading %s: %w", dest, err)
		}
		for _, m := range page {
			out = append(out, letter(dest, m))
		}
		if len(page) < listPage || page[len(page)-1].ID == end {
			return out, nil
		}
		start = "(" + page[len(page)-1].ID
	}
}

// letter reads a dead-letter entry; the entry's own fields become
// Headers, in name order (a stream entry read back keeps no order here),
// the payload field aside.
func letter(dest string, m redis.XMessage) dlq.Letter {
	l := dlq.Letter{Destination: dest, Position: m.ID}
	keys := make([]string, 0, len(m.Values))
	for k := range m.Values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v, _ := m.Values[k].(string)
		switch k {
		case FieldDLQReason:
			l.Error = v
		case FieldDLQStream:
			l.OriginalTopic = v
		case FieldDLQID:
		case routing.RedisPayloadField:
			l.Payload = []byte(v)
		default:
			l.Headers = append(l.Headers, dlq.Header{Key: k, Value: v})
			switch k {
			case outbox.HeaderEventID:
				l.EventID, _ = strconv.ParseInt(v, 10, 64)
			case outbox.HeaderEventType:
				l.Type = v
			case outbox.HeaderEventSource:
				l.Source = v
			case outbox.HeaderAggregateID:
				l.Key = []byte(v)
			}
		}
	}
	return l
}

// Replay adds each letter to its original stream, in order, with its
// fields (Headers) and its payload field when it had one, and returns how
// many Redis acknowledged. It leaves the dead letters where they are.
func (d *DeadLetters) Replay(ctx context.Context, letters []dlq.Letter) (int, error) {
	for _, l := range letters {
		if err := l.Replayable(); err != nil {
			return 0, err
		}
		if len(l.Headers) == 0 && l.Payload == nil {
			return 0, fmt.Errorf("redisconsumer: dead letter %s of %s has no fields of its own to replay", l.Position, l.Destination)
		}
	}
	for i, l := range letters {
		vals := make([]any, 0, 2*len(l.Headers)+2)
		for _, h := range l.Headers {
			vals = append(vals, h.Key, h.Value)
		}
		if l.Payload != nil {
			vals = append(vals, routing.RedisPayloadField, string(l.Payload))
		}
		if err := d.client.XAdd(ctx, &redis.XAddArgs{Stream: l.OriginalTopic, Values: vals}).Err(); err != nil {
			return i, fmt.Errorf("redisconsumer: replaying %s of %s to %s: %w", l.Position, l.Destination, l.OriginalTopic, err)
		}
	}
	return len(letters), nil
}
