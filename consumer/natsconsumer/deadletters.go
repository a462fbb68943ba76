package natsconsumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer/dlq"
	"github.com/pgoutbox/outbox/routing"
)

// DeadLetters is the dlq.Store of the Consumer's dead letters: the
// messages a stream captured from the dead-letter subjects (DeadLetterPrefix
// followed by the original subject, "dlq.>" by default).
//
// List reads the stream it is given by sequence, from its first to its
// last as List was called, one message get each: it consumes nothing,
// creates no consumer, and skips the sequences deleted. Replay publishes
// each letter back to its original subject (the dlq_original_subject
// header) with its payload and its original headers, the dead-letter ones
// removed, and waits for JetStream's acknowledgement of each; the dead
// letters stay in their stream (purge or delete them with the nats CLI).
//
// A replayed message carries no Nats-Msg-Id: the relay's was dropped when
// the message was dead-lettered, and a message with the relay's id sent
// again within the stream's duplicate window would be dropped by the
// server as a duplicate, and the event never come back. A new id would
// make a second replay within the window (after a fix that did not work,
// say) vanish the same way. Consumers dedupe on event_id, so a letter
// replayed twice is processed once.
type DeadLetters struct {
	nc *nats.Conn
	js jetstream.JetStream
}

var _ dlq.Store = (*DeadLetters)(nil)

// NewDeadLetters reads and replays dead letters on nc, which it owns from
// then on: Close closes it.
func NewDeadLetters(nc *nats.Conn) (*DeadLetters, error) {
	if nc == nil {
		return nil, errors.New("natsconsumer: nc is nil; pass nats.Connect(url)")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natsconsumer: %w", err)
	}
	return &DeadLetters{nc: nc, js: js}, nil
}

// Close closes the connection.
func (d *DeadLetters) Close() { d.nc.Close() }

// List returns the dead letters of the stream named dest, in sequence
// order.
func (d *DeadLetters) List(ctx context.Context, dest string) ([]dlq.Letter, error) {
	s, err := d.js.Stream(ctx, dest)
	if err != nil {
		return nil, fmt.Errorf("natsconsumer: dead-letter stream %q: %w (name the stream that captures the dead-letter subjects, e.g. one made with: nats stream add DLQ --subjects 'dlq.>')", dest, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("natsconsumer: dead-letter stream %q: %w", dest, err)
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	var out []dlq.Letter
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted, or expired since Info
		}
		if err != nil {
			return nil, fmt.Errorf("natsconsumer: reading %s sequence %d: %w", dest, seq, err)
		}
		out = append(out, fromRaw(dest, m))
	}
	return out, nil
}

// fromRaw reads a stored dead letter. Headers keeps the original headers
// as NATS carries them (escaped, values in order, keys sorted), so that
// Replay sends them back unchanged.
func fromRaw(dest string, m *jetstream.RawStreamMsg) dlq.Letter {
	l := dlq.Letter{Destination: dest, Position: strconv.FormatUint(m.Sequence, 10), Payload: m.Data}
	for _, k := range slices.Sorted(maps.Keys(m.Header)) {
		vs := m.Header[k]
		if len(vs) == 0 {
			continue
		}
		switch k {
		case HeaderDLQError:
			l.Error = vs[0]
		case HeaderDLQConsumer:
			l.Consumer = vs[0]
		case HeaderDLQAttempts:
			l.Attempts, _ = strconv.Atoi(vs[0])
		case HeaderDLQOriginalSubject:
			l.OriginalTopic = vs[0]
		case HeaderDLQOriginalSeq, routing.HeaderNATSMsgID:
			// Where it was, and the dead letter's own dedupe id.
		default:
			for _, v := range vs {
				l.Headers = append(l.Headers, dlq.Header{Key: k, Value: v})
			}
			readEventHeader(&l, k, vs[0])
		}
	}
	return l
}

// readEventHeader notes the event's own headers, unescaped as the
// Consumer reads them; Key is the aggregate id, as the Consumer keys
// deliveries (NATS messages have no key).
func readEventHeader(l *dlq.Letter, key, value string) {
	name, v, err := routing.UnescapeNATSHeader(key, value)
	if err != nil {
		name, v = key, value
	}
	switch name {
	case outbox.HeaderEventID:
		l.EventID, _ = strconv.ParseInt(v, 10, 64)
	case outbox.HeaderEventType:
		l.Type = v
	case outbox.HeaderEventSource:
		l.Source = v
	}
	if name == outbox.HeaderAggregateID {
		l.Key = []byte(v)
	}
}

// Replay publishes each letter to its original subject, in order, and
// waits for the stream's acknowledgement of each.
func (d *DeadLetters) Replay(ctx context.Context, letters []dlq.Letter) (int, error) {
	for _, l := range letters {
		if err := l.Replayable(); err != nil {
			return 0, err
		}
	}
	for i, l := range letters {
		m := &nats.Msg{Subject: l.OriginalTopic, Data: l.Payload, Header: nats.Header{}}
		for _, h := range l.Headers {
			if h.Key != routing.HeaderNATSMsgID {
				m.Header.Add(h.Key, h.Value)
			}
		}
		if _, err := d.js.PublishMsg(ctx, m); err != nil {
			return i, fmt.Errorf("natsconsumer: replaying %s of %s to %s: %w (is a stream capturing %s?)", l.Position, l.Destination, l.OriginalTopic, err, l.OriginalTopic)
		}
	}
	return len(letters), nil
}
