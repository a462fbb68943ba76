package relay_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/contracts"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// loadContracts writes files (path: content) into a directory and loads it.
func loadContracts(t *testing.T, files map[string]string) *contracts.Set {
	t.Helper()
	dir := t.TempDir()
	for p, body := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(body), 0o644))
	}
	set, err := contracts.Load(dir)
	require.NoError(t, err)
	return set
}

const (
	orderV1 = `{"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}}`
	orderV2 = `{"type": "object", "required": ["order_id", "total_cents"],
  "properties": {"order_id": {"type": "string"}, "total_cents": {"type": "integer"}}}`
)

// CheckContract, event by event: what passes, what is stamped, what is
// refused and in which words.
func TestCheckContract(t *testing.T) {
	t.Parallel()
	set := loadContracts(t, map[string]string{"order.placed/v1.schema.json": orderV1, "order.placed/v2.schema.json": orderV2})
	v2 := `{"order_id": "a", "total_cents": 1}`
	for _, tc := range []struct {
		name, typ, payload string
		headers            map[string]string
		want               map[string]string // headers after a pass
		err                []string          // a refusal's words
	}{
		{name: "latest, stamped", typ: "order.placed", payload: v2, want: map[string]string{"event_version": "2"}},
		{name: "latest, other headers kept", typ: "order.placed", payload: v2, headers: map[string]string{"trace": "t"}, want: map[string]string{"trace": "t", "event_version": "2"}},
		{name: "the row's version", typ: "order.placed", payload: `{"order_id": "a"}`, headers: map[string]string{"event_version": "1"}, want: map[string]string{"event_version": "1"}},
		{name: "breaks the latest", typ: "order.placed", payload: `{"order_id": "a"}`, err: []string{"order.placed v2", "rule /required", "then retry the event"}},
		{name: "breaks its version", typ: "order.placed", payload: `{"order_id": 5}`, headers: map[string]string{"event_version": "1"}, err: []string{"order.placed v1: at /order_id", "rule /properties/order_id/type"}},
		{name: "not JSON", typ: "order.placed", payload: `{"order_id"`, err: []string{"not valid JSON"}},
		{name: "unknown version", typ: "order.placed", payload: v2, headers: map[string]string{"event_version": "3"}, err: []string{"order.placed v3; its contract has v1, v2"}},
		{name: "version 0", typ: "order.placed", payload: v2, headers: map[string]string{"event_version": "0"}, err: []string{`header event_version is "0", not a version`}},
		{name: "leading zero", typ: "order.placed", payload: v2, headers: map[string]string{"event_version": "02"}, err: []string{`"02", not a version`}},
		{name: "sign", typ: "order.placed", payload: v2, headers: map[string]string{"event_version": "+2"}, err: []string{`"+2", not a version`}},
		{name: "v prefix", typ: "order.placed", payload: v2, headers: map[string]string{"event_version": "v2"}, err: []string{`"v2", not a version`}},
		{name: "space", typ: "order.placed", payload: v2, headers: map[string]string{"event_version": "2 "}, err: []string{`"2 ", not a version`}},
		{name: "empty", typ: "order.placed", payload: v2, headers: map[string]string{"event_version": ""}, err: []string{`"", not a version`}},
		{name: "huge", typ: "order.placed", payload: v2, headers: map[string]string{"event_version": "99999999999999999999"}, err: []string{"not a version"}},
		{name: "no contract", typ: "payment.captured", payload: `[1]`, want: nil},
		{name: "no contract, any header", typ: "payment.captured", payload: `{}`, headers: map[string]string{"event_version": "x"}, want: map[string]string{"event_version": "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := relay.Message{Type: tc.typ, Payload: []byte(tc.payload), Headers: tc.headers}
			err := relay.CheckContract(set, &m)
			if tc.err == nil {
				require.NoError(t, err)
				require.Equal(t, tc.want, m.Headers)
				return
			}
			require.Error(t, err)
			require.Equal(t, relay.ReasonContract, relay.ReasonOf(err))
			for _, w := range tc.err {
				require.Contains(t, err.Error(), w)
			}
			require.Equal(t, tc.headers, m.Headers, "a refused event's headers are left alone")
		})
	}

	t.Run("no contracts", func(t *testing.T) {
		t.Parallel()
		m := relay.Message{Type: "order.placed", Payload: []byte(`"anything"`)}
		require.NoError(t, relay.CheckContract(nil, &m))
		require.Nil(t, m.Headers)
	})
	t.Run("a violation is wrapped", func(t *testing.T) {
		t.Parallel()
		m := relay.Message{Type: "order.placed", Payload: []byte(`{"order_id": "a", "total_cents": "x"}`)}
		var v *contracts.Violation
		require.ErrorAs(t, relay.CheckContract(set, &m), &v)
		require.Equal(t, "/total_cents", v.Pointer)
	})
	t.Run("a batch", func(t *testing.T) {
		t.Parallel()
		// Large enough for several goroutines; each row's result in its
		// place, rows already refused left alone.
		msgs := make([]relay.Message, 1000)
		refuse := make([]error, len(msgs))
		earlier := errors.New("refused before")
		for i := range msgs {
			msgs[i] = relay.Message{ID: int64(i), Type: "order.placed", Payload: []byte(v2)}
			switch i % 3 {
			case 1:
				msgs[i].Payload = []byte(`{"order_id": "a"}`)
			case 2:
				refuse[i] = earlier
			}
		}
		relay.CheckContracts(set, msgs, refuse)
		for i, m := range msgs {
			switch i % 3 {
			case 0:
				require.NoError(t, refuse[i], "row %d", i)
				require.Equal(t, "2", m.Headers["event_version"], "row %d", i)
			case 1:
				require.Equal(t, relay.ReasonContract, relay.ReasonOf(refuse[i]), "row %d", i)
			case 2:
				require.Same(t, earlier, refuse[i], "row %d", i)
				require.Nil(t, m.Headers, "row %d is not checked", i)
			}
		}
	})
	t.Run("required", func(t *testing.T) {
		t.Parallel()
		req := loadContracts(t, map[string]string{"contracts.json": `{"require": true}`, "order.placed/v1.schema.json": orderV1})
		for _, h := range []map[string]string{nil, {"event_version": "1"}, {"event_version": "x"}} {
			m := relay.Message{Type: "payment.captured", Payload: []byte(`{}`), Headers: h}
			err := relay.CheckContract(req, &m)
			require.ErrorIs(t, err, contracts.ErrNoContract, "headers %v", h)
			require.Equal(t, relay.ReasonContract, relay.ReasonOf(err))
		}
	})
}

// A row that breaks its contract is held, its aggregate's later rows wait,
// the watchdog shows it with its reason and error; once the row, or the
// contract, is fixed, `outbox events retry` (ops.Retry) sends it, then the
// rows behind it, with the version it was checked against.
func TestContractHoldIsRetriedOnceFixed(t *testing.T) {
	t.Parallel()
	strict := map[string]string{"order.placed/v1.schema.json": orderV2}
	for _, tc := range []struct {
		name string
		fix  func(t *testing.T, b *bundle, id int64) map[string]string // returns the contracts to restart with
	}{
		{"row fixed", func(t *testing.T, b *bundle, id int64) map[string]string {
			_, err := b.db.Pool.Exec(context.Background(), `UPDATE `+b.db.Tables.OutboxIdent()+` SET payload = '{"order_id": "a", "total_cents": 10}' WHERE id = $1`, id)
			require.NoError(t, err)
			return strict
		}},
		{"contract fixed", func(*testing.T, *bundle, int64) map[string]string {
			return map[string]string{"order.placed/v1.schema.json": orderV1}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			agg := uuid.New()
			first := b.db.InsertRaw(t, agg, "order.placed", `'{"order_id": "a", "total_cents": 1}'`, "NULL")
			bad := b.db.InsertRaw(t, agg, "order.placed", `'{"order_id": "a"}'`, "NULL")
			behind := b.db.InsertRaw(t, agg, "order.placed", `'{"order_id": "a", "total_cents": 2}'`, "NULL")
			other := b.db.InsertRaw(t, uuid.New(), "order.placed", `'{"order_id": "b", "total_cents": 3}'`, "NULL")

			m := monitor.NewMetrics()
			stop := run(t, b.relayer(t, func(c *relay.Config) {
				c.Contracts, c.Hooks = loadContracts(t, strict), []relay.Hook{m}
			}))
			require.Eventually(t, func() bool { return len(b.holds(t)) == 1 }, 10*time.Second, 20*time.Millisecond)
			h := b.holds(t)[0]
			require.Equal(t, bad, h.EventID)
			require.Equal(t, relay.ReasonContract, h.Reason)
			require.Contains(t, h.Err, "order.placed v1")
			require.Contains(t, h.Err, "rule /required")
			recs := b.consume(t, 2, 10*time.Second, "order")
			require.ElementsMatch(t, []int64{first, other}, eventIDs(recs))
			require.Equal(t, []int64{bad, behind}, b.pendingIDs(t))
			rep, err := ops.Check(ctx, b.db.Pool, ops.WatchdogConfig{Tables: b.db.Tables})
			require.NoError(t, err)
			require.Equal(t, map[string]int64{relay.ReasonContract: 1}, rep.HeldByReason)
			stop()
			require.Equal(t, 1.0, metricValue(t, m, "outbox_holds_total", map[string]string{"reason": relay.ReasonContract}))
			require.Equal(t, 1.0, metricValue(t, m, "outbox_publish_errors_total", map[string]string{"kind": "permanent", "code": monitor.CodeRejectedByRelay}))

			// Retried without a fix, it is held again.
			set := loadContracts(t, tc.fix(t, b, bad))
			_, err = ops.Retry(ctx, b.db.Pool, ops.RetryConfig{Tables: b.db.Tables, EventID: bad, Apply: true})
			require.NoError(t, err)
			run(t, b.relayer(t, func(c *relay.Config) { c.Contracts = set }))
			b.waitDrained(t, 10*time.Second)
			recs = b.consume(t, 4, 10*time.Second, "order")
			require.Equal(t, []int64{first, bad, behind}, idsOf(recs, agg))
			for _, r := range recs {
				require.Equal(t, "1", r.Headers[outbox.HeaderEventVersion], "event %d", r.EventID)
			}
		})
	}
}

func eventIDs(recs []record) []int64 {
	out := make([]int64, len(recs))
	for i, r := range recs {
		out[i] = r.EventID
	}
	return out
}

// idsOf lists the ids of agg's records, in the order they arrived.
func idsOf(recs []record, agg uuid.UUID) []int64 {
	var out []int64
	for _, r := range recs {
		if r.Key == agg.String() {
			out = append(out, r.EventID)
		}
	}
	return out
}

// metricValue reads the value of the counter or gauge name with exactly
// labels from m, 0 when it has no such series.
func metricValue(t *testing.T, m *monitor.Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range mt.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if !maps.Equal(got, labels) {
				continue
			}
			if c := mt.GetCounter(); c != nil {
				return c.GetValue()
			}
			return mt.GetGauge().GetValue()
		}
	}
	return 0
}

// The version the relay checked a plain-SQL row against is the event's
// CloudEvents dataschema too, for a sink that stamps the attributes.
func TestContractVersionIsTheCloudEventsDataSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.db.InsertRaw(t, uuid.New(), "order.placed", `'{"order_id": "a", "total_cents": 1}'`, "NULL")
	pub := kafkapub.NewPublisher(b.client(t), kafkapub.PublisherConfig{CloudEvents: &cloudevents.Config{Source: "urn:outbox:test"}})
	set := loadContracts(t, map[string]string{"order.placed/v1.schema.json": orderV1, "order.placed/v2.schema.json": orderV2})
	run(t, b.relayer(t, func(c *relay.Config) { c.Sink, c.Contracts = pub, set }))
	recs := b.consume(t, 1, 10*time.Second, "order")
	require.Len(t, recs, 1)
	require.Equal(t, id, recs[0].EventID)
	require.Equal(t, "2", recs[0].Headers[outbox.HeaderEventVersion])
	require.Equal(t, cloudevents.DataSchemaURN+"order.placed:v2", recs[0].Headers["ce_dataschema"])
}
