package walrelay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/binarytest"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

func binarySetup(t *testing.T) (*bundle, *outbox.Producer) {
	t.Helper()
	b := setup(t)
	m, err := migrate.New(b.db.Tables)
	require.NoError(t, err)
	_, err = m.EnableBinaryPayloads(context.Background(), b.db.Pool)
	require.NoError(t, err)
	p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables, BinaryPayloads: true})
	require.NoError(t, err)
	return b, p
}

// The WAL source publishes binary payloads byte for byte, with their
// content type, read from the log's text of payload_bytes.
func TestWALRelaysBinaryPayloadsExactly(t *testing.T) {
	t.Parallel()
	b, p := binarySetup(t)
	r := b.relayer(t, nil)
	run(t, r)
	waitLeading(t, r)
	want := binarytest.Emit(t, b.db, b.db.Pool, p, uuid.New(), "walbin.happened")
	recs := kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeast(len(want)), "walbin")
	got := map[int64]binarytest.Want{}
	for _, rec := range recs {
		got[kafkatest.EventID(rec)] = binarytest.Want{Payload: rec.Value, ContentType: kafkatest.Headers(rec)[outbox.HeaderContentType]}
	}
	binarytest.Check(t, want, got)
}

// A binary event the WAL source cannot publish is parked whole: its bytes
// and content type, not a JSON rendering of them.
func TestWALParksBinaryPayloadsWhole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, p := binarySetup(t)
	// The prefix makes every topic longer than Kafka allows: parked at once.
	r := b.relayer(t, func(c *walrelay.Config) { c.TopicPrefix = strings.Repeat("p", 245) })
	run(t, r)
	waitLeading(t, r)
	data := []byte{0, 0xff, 0xfe, 'a', 0}
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	id, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "parkbin.happened", Payload: outbox.Bytes{ContentType: "application/x-protobuf", Data: data}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Eventually(t, func() bool { return r.Stats().Parked == 1 }, 30*time.Second, 20*time.Millisecond)
	var got []byte
	var ct string
	var payload *string
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT payload::text, payload_bytes, content_type FROM "+migrate.ParkedIdent(b.db.Tables)+" WHERE id = $1", id).Scan(&payload, &got, &ct))
	require.Nil(t, payload)
	require.Equal(t, data, got)
	require.Equal(t, "application/x-protobuf", ct)
}
