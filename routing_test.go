package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/fakesink"
)

// Emit asks Config.Routing, not Kafka's rules: with a routing whose
// prefixes may hold '/', whose types may not hold '_' and whose limit is
// 100 bytes, it takes a prefix and an event Kafka's routing refuses, and
// refuses, on every path, a type and a size Kafka's routing takes, saying
// so in the routing's words.
func TestEmitAsksTheRouting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	routing := fakesink.PathRouting{Prefix: "shop/"}
	_, err := outbox.NewProducer(outbox.Config{TopicPrefix: routing.Prefix})
	require.ErrorContains(t, err, "cannot start a topic name", "Kafka's routing refuses the prefix")
	db, p := setup(t, outbox.Config{Routing: routing})

	// 16 bytes of type and 84 of payload: the routing's limit, to the byte.
	fits := outbox.Event{AggregateID: uuid.New(), Type: "orders-eu.placed", Payload: []byte(`"` + strings.Repeat("x", 82) + `"`)}
	require.Equal(t, fakesink.PathLimit, routing.Size(fits.Type, 84, nil))
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	_, err = p.Emit(ctx, tx, fits)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, countRows(t, db))

	kafka, err := outbox.NewProducer(outbox.Config{})
	require.NoError(t, err)
	kafkaFine := outbox.Event{AggregateID: uuid.New(), Type: "order_eu.placed", Payload: 1}
	big := fits
	big.Payload = []byte(`"` + strings.Repeat("x", 83) + `"`)
	for _, tc := range []struct {
		name string
		ev   outbox.Event
		is   error
		msg  string
	}{
		{"type", kafkaFine, outbox.ErrInvalidTopic, `type "order_eu.placed" names no path`},
		{"size", big, outbox.ErrPayloadTooLarge, `type "orders-eu.placed" makes a body of 101 bytes as the endpoint will see it, of which the payload after Postgres' JSONB normalisation is 85 bytes, the type 16 and the headers 0; the limit is 100 bytes: set the endpoint's body limit higher, or shrink the event`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, outbox.Validate(kafka, tc.ev), "Kafka's routing takes it")
			_, err := p.Emit(ctx, nil, tc.ev)
			require.ErrorIs(t, err, tc.is)
			require.ErrorContains(t, err, tc.msg)
			_, err = p.EmitBatch(ctx, nil, []outbox.Event{fits, tc.ev})
			require.ErrorIs(t, err, tc.is)
			_, err = p.QueueEmit(ctx, &pgx.Batch{}, tc.ev)
			require.ErrorIs(t, err, tc.is)
			_, err = p.EmitSQL(ctx, (*sql.Tx)(nil), tc.ev)
			require.ErrorIs(t, err, tc.is)
			_, err = p.EmitBatchSQL(ctx, (*sql.Tx)(nil), []outbox.Event{tc.ev})
			require.ErrorIs(t, err, tc.is)
		})
	}
	require.Equal(t, 1, countRows(t, db), "nothing refused was written")
}

// TopicPrefix and MaxRecordBytes configure the default Kafka routing; set
// beside another routing they would be ignored, so NewProducer refuses
// them, and it validates a KafkaRouting passed as Routing.
func TestNewProducerRefusesKafkaFieldsBesideARouting(t *testing.T) {
	t.Parallel()
	for _, cfg := range []outbox.Config{
		{Routing: fakesink.PathRouting{}, TopicPrefix: "prod."},
		{Routing: fakesink.PathRouting{}, MaxRecordBytes: 2 << 20},
	} {
		_, err := outbox.NewProducer(cfg)
		require.ErrorContains(t, err, "configure only the default Kafka routing")
	}
	_, err := outbox.NewProducer(outbox.Config{Routing: outbox.KafkaRouting{TopicPrefix: "bad prefix"}})
	require.ErrorContains(t, err, `outbox: Config.Routing: TopicPrefix "bad prefix" cannot start a topic name`)
	p, err := outbox.NewProducer(outbox.Config{})
	require.NoError(t, err)
	require.Equal(t, outbox.KafkaRouting{MaxRecordBytes: outbox.DefaultMaxRecordBytes}, p.Config().Routing, "the default, as Config reports it")
}
