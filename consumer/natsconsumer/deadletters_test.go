package natsconsumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer/natsconsumer"
	"github.com/pgoutbox/outbox/internal/natstest"
)

// List reads the dead-letter stream without consuming it, skipping deleted
// sequences; Replay sends each letter back with its original headers,
// none of the dead-letter ones and no Nats-Msg-Id, so that a replay
// within the duplicate window is not dropped; the dead letters stay.
func TestDeadLettersListAndReplay(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv.URL())
	natstest.AddStream(t, js, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"e.>"}})
	dlqStream := natstest.AddStream(t, js, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.>"}})
	dead := func(id, subject string) {
		m := &nats.Msg{Subject: "dlq." + subject, Data: []byte(`{"id": ` + id + `}`), Header: nats.Header{}}
		m.Header.Set("event_id", id)
		m.Header.Set("event_type", "order.placed")
		m.Header.Set("aggregate_id", "agg-"+id)
		m.Header.Add("x-note", "a")
		m.Header.Add("x-note", "b")
		m.Header.Set(natsconsumer.HeaderDLQError, "permanent: no price")
		m.Header.Set(natsconsumer.HeaderDLQConsumer, "billing")
		m.Header.Set(natsconsumer.HeaderDLQAttempts, "3")
		m.Header.Set(natsconsumer.HeaderDLQOriginalSubject, subject)
		m.Header.Set(natsconsumer.HeaderDLQOriginalSeq, "9")
		m.Header.Set("Nats-Msg-Id", "dlq:billing:EVENTS:"+id)
		_, err := js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	dead("1", "e.order.placed")
	dead("2", "e.order.placed")
	dead("3", "e.order.placed")
	require.NoError(t, dlqStream.DeleteMsg(ctx, 2))

	store, err := natsconsumer.NewDeadLetters(nc)
	require.NoError(t, err)
	for range 2 { // reading twice: List consumes nothing
		letters, err := store.List(ctx, "DLQ")
		require.NoError(t, err)
		require.Len(t, letters, 2)
		require.Equal(t, []string{"1", "3"}, []string{letters[0].Position, letters[1].Position})
		l := letters[1]
		require.Equal(t, "DLQ", l.Destination)
		require.Equal(t, int64(3), l.EventID)
		require.Equal(t, "order.placed", l.Type)
		require.Equal(t, "billing", l.Consumer)
		require.Equal(t, 3, l.Attempts)
		require.Equal(t, "permanent: no price", l.Error)
		require.Equal(t, "e.order.placed", l.OriginalTopic)
		require.Equal(t, `{"id": 3}`, string(l.Payload))
	}
	letters, err := store.List(ctx, "DLQ")
	require.NoError(t, err)
	for range 2 { // the second replay, within the duplicate window, arrives too
		sent, err := store.Replay(ctx, letters[1:])
		require.NoError(t, err)
		require.Equal(t, 1, sent)
	}
	back := natstest.ReadStream(t, js, "EVENTS", "")
	require.Len(t, back, 2)
	for _, m := range back {
		require.Equal(t, "e.order.placed", m.Subject)
		require.Equal(t, `{"id": 3}`, string(m.Data))
		require.Equal(t, nats.Header{"event_id": {"3"}, "event_type": {"order.placed"}, "aggregate_id": {"agg-3"}, "x-note": {"a", "b"}}, m.Header)
	}
	require.Len(t, natstest.ReadStream(t, js, "DLQ", ""), 2, "the dead letters stay")

	_, err = store.List(ctx, "NOPE")
	require.ErrorContains(t, err, `dead-letter stream "NOPE"`)
	store.Close()
	require.True(t, nc.IsClosed())
}
