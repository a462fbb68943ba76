package walrelay_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/contracts"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// An event that breaks its contract, whether a plain INSERT or a
// message-mode event, is parked with reason contract and the violation's
// pointer and rule, and the stream goes on, its aggregate's later event
// included; once fixed in the parked table, `outbox events unpark` puts it
// back and it is published, with the version it was checked against.
func TestContractViolationIsParkedThenUnparkedOnceFixed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "order.placed"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "order.placed", "v1.schema.json"),
		[]byte(`{"type": "object", "required": ["total_cents"], "properties": {"total_cents": {"type": "integer"}}}`), 0o644))
	set, err := contracts.Load(dir)
	require.NoError(t, err)
	start := func() func() {
		r := b.relayer(t, func(c *walrelay.Config) { c.Contracts = set })
		stop := run(t, r)
		waitLeading(t, r)
		return stop
	}
	stop := start()

	ctx := context.Background()
	agg, msgAgg := uuid.New(), uuid.New()
	bad := b.db.InsertRaw(t, agg, "order.placed", `'{"total_cents": "ten"}'`, "NULL")
	after := b.db.InsertRaw(t, agg, "order.placed", `'{"total_cents": 10}'`, "NULL")
	var badMsg int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables, Mode: outbox.ModeMessage})
		require.NoError(t, err)
		badMsg, err = p.Emit(ctx, tx, outbox.Event{AggregateID: msgAgg, Type: "order.placed", Payload: map[string]any{}})
		return err
	}))
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeastThenQuiet(1, 500*time.Millisecond), "order")
	require.Len(t, recs, 1)
	require.Equal(t, after, kafkatest.EventID(recs[0]), "the stream goes on, the aggregate's later event included")
	require.Equal(t, "1", header(recs[0], outbox.HeaderEventVersion))

	parked := func() map[int64][2]string {
		rows, err := b.db.Pool.Query(ctx, `SELECT id, reason, last_error FROM `+migrate.ParkedIdent(b.db.Tables))
		require.NoError(t, err)
		out := map[int64][2]string{}
		var (
			id          int64
			reason, msg string
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &reason, &msg}, func() error {
			out[id] = [2]string{reason, msg}
			return nil
		})
		require.NoError(t, err)
		return out
	}
	require.Eventually(t, func() bool { return len(parked()) == 2 }, 10*time.Second, 20*time.Millisecond)
	p := parked()
	require.Equal(t, "wal relay: "+relay.ReasonContract, p[bad][0])
	require.Contains(t, p[bad][1], "order.placed v1: at /total_cents")
	require.Contains(t, p[bad][1], "rule /properties/total_cents/type")
	require.Equal(t, "wal relay: contract", p[badMsg][0])
	require.Contains(t, p[badMsg][1], "rule /required")

	// Unparked unfixed, it is parked again.
	_, err = ops.Unpark(ctx, b.db.Pool, ops.UnparkConfig{Tables: b.db.Tables, ID: bad, Apply: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(parked()) == 2 }, 10*time.Second, 20*time.Millisecond)
	stop()

	_, err = b.db.Pool.Exec(ctx, `UPDATE `+migrate.ParkedIdent(b.db.Tables)+` SET payload = '{"total_cents": 1}'`)
	require.NoError(t, err)
	start()
	for _, id := range []int64{bad, badMsg} {
		_, err = ops.Unpark(ctx, b.db.Pool, ops.UnparkConfig{Tables: b.db.Tables, ID: id, Apply: true})
		require.NoError(t, err)
	}
	recs = kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeastThenQuiet(3, 500*time.Millisecond), "order")
	require.Len(t, recs, 3, "the violations were never published unfixed")
	got := map[int64]string{}
	for _, r := range recs {
		got[kafkatest.EventID(r)] = header(r, outbox.HeaderEventVersion)
		if id := kafkatest.EventID(r); id != after {
			require.JSONEq(t, `{"total_cents": 1}`, string(r.Value), "event %d is published as fixed", id)
		}
	}
	require.Equal(t, map[int64]string{after: "1", bad: "1", badMsg: "1"}, got)
	require.Empty(t, parked())
}

// header returns the value of r's header key, "" when it has none.
func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
