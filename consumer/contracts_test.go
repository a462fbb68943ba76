package consumer_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/contracts"
)

// A consumer that checks contracts dead-letters, at once and with the
// pointer and the rule, an event that breaks its contract (written by a
// producer that checked nothing), and applies the events beside it: one of
// an upcast older version is checked in the shape the handler reads.
func TestCheckContractsEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for p, body := range map[string]string{
		"t.placed/v1.schema.json": `{"type":"object","required":["total"],"properties":{"total":{"type":"number"}}}`,
		"t.placed/v2.schema.json": `{"type":"object","required":["total_cents"],"properties":{"total_cents":{"type":"integer"}}}`,
		"t.placed/v3.schema.json": `{"type":"object","required":["total_cents","currency"],"properties":{"total_cents":{"type":"integer"},"currency":{"enum":["EUR","USD"]}}}`,
	} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644))
	}
	set, err := contracts.Load(dir)
	require.NoError(t, err)

	b := setup(t)
	b.createApplied(t)
	ctx := context.Background()
	p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables}) // checks nothing
	require.NoError(t, err)
	agg := uuid.New()
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		for _, ev := range []outbox.Event{
			{Type: "t.placed", Version: 3, Payload: json.RawMessage(`{"total_cents": 700, "currency": "USD"}`)},
			{Type: "t.placed", Version: 3, Payload: json.RawMessage(`{"total_cents": 700, "currency": "GBP"}`)},
			{Type: "t.placed", Version: 1, Payload: json.RawMessage(`{"total": 2.5}`)},
			{Type: "t.shipped", Payload: json.RawMessage(`{"anything": true}`)},
		} {
			ev.AggregateID = agg
			id, err := p.Emit(ctx, tx, ev)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	}))
	startRelay(t, b)
	cfg := b.config(map[string]consumer.Handler{"t.placed": applyAs("c"), "t.shipped": applyAs("c")})
	cfg.Middleware = []consumer.Middleware{orderUpcasters(t).Want("t.placed", 3), consumer.CheckContracts(set)}
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	run(t, c)

	dlq := b.read(t, "t.dlq", 1, 30*time.Second)
	require.Len(t, dlq, 1)
	h := headers(dlq[0])
	require.Equal(t, strconv.FormatInt(ids[1], 10), h[outbox.HeaderEventID])
	require.Equal(t, "1", h[consumer.HeaderDLQAttempts], "a contract violation is not retried")
	require.Contains(t, h[consumer.HeaderDLQError], "t.placed v3: at /currency")
	require.Contains(t, h[consumer.HeaderDLQError], "/properties/currency/enum")

	require.Eventually(t, func() bool { return len(b.appliedBy(t, "c")) == 3 }, 30*time.Second, 50*time.Millisecond)
	applied := b.appliedBy(t, "c")
	require.Contains(t, applied, ids[0])
	require.NotContains(t, applied, ids[1])
	require.Equal(t, 3, applied[ids[2]].Version, "the v1 event was upcast, then checked as v3")
	require.JSONEq(t, `{"total_cents": 250, "currency": "EUR"}`, applied[ids[2]].Payload)
	require.Contains(t, applied, ids[3], "a type without a contract passes")
}

func TestCheckContractsNil(t *testing.T) {
	t.Parallel()
	require.PanicsWithValue(t, "consumer: CheckContracts(nil): pass the contracts to check against (contracts.Load)", func() { consumer.CheckContracts(nil) })
}
