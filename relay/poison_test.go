package relay_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/internal/testlog"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// limitBroker is a broker whose message.max.bytes is 100,000, as in the
// issue that found these defects.
func limitBroker() kfake.Opt {
	return kfake.BrokerConfigs(map[string]string{"message.max.bytes": "100000"})
}

// insertRaw writes a row by plain SQL, the way a non-Go producer does, and
// returns its id. payload and headers are SQL expressions.
func (b *bundle) insertRaw(t *testing.T, agg uuid.UUID, typ, payload, headers string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `INSERT INTO `+b.db.Tables.OutboxIdent()+
		` (aggregate_id, type, payload, headers) VALUES ($1, $2, `+payload+`, `+headers+`) RETURNING id`, agg, typ).Scan(&id))
	return id
}

// insertLegacy writes a row as insertRaw does, but one that the insert
// guard (migration 6) now refuses: a row written before that migration,
// which the relayer must still hold with its reason.
func (b *bundle) insertLegacy(t *testing.T, agg uuid.UUID, typ, payload, headers string) int64 {
	t.Helper()
	var id int64
	b.db.WriteLegacy(t, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `INSERT INTO `+b.db.Tables.OutboxIdent()+
			` (aggregate_id, type, payload, headers) VALUES ($1, $2, `+payload+`, `+headers+`) RETURNING id`, agg, typ).Scan(&id)
	})
	return id
}

// randomText is n hex characters of random bytes: a JSON string that no
// compression shrinks much.
func randomText(n int) string {
	raw := make([]byte, n/2+1)
	_, _ = rand.Read(raw)
	return hex.EncodeToString(raw)[:n]
}

// pendingIDs lists the rows not yet dispatched, in id order.
func (b *bundle) pendingIDs(t *testing.T) []int64 {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), "SELECT id FROM "+b.db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL ORDER BY id")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// Issue 9, defect 1: one oversized row among 2,000 small ones, on a broker
// that takes 100,000 bytes. Before, the broker refused each partition's
// whole request, every record of it was held, the holds expired together
// and failed together again: 600 healthy rows pending for minutes. Now only
// the big row is held, whether the publisher refuses it before sending
// (it learnt the broker's limit) or the broker refuses a whole request
// (here forced by a publisher told the limit is 1 MB): then the request is
// split until the big row fails alone. Several hold cycles pass, two
// relayers run, and nothing but the big row and the rows of its aggregate
// behind it is ever held or left pending.
func TestOversizedRowHoldsOnlyItself(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		override int
	}{
		{"refused before sending", 0},
		{"refused by the broker, request split", 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, limitBroker())
			aggs := make([]uuid.UUID, 50)
			for i := range aggs {
				aggs[i] = uuid.New()
			}
			big := b.insertRaw(t, aggs[0], "order.placed", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(400_000)), "NULL")
			var behind []int64 // rows of the big row's aggregate: they wait
			for i := range 2000 {
				agg := aggs[i%len(aggs)]
				id := b.insertRaw(t, agg, "order.placed", fmt.Sprintf(`'{"n": %d}'`, i), "NULL")
				if agg == aggs[0] {
					behind = append(behind, id)
				}
			}
			for range 2 {
				pub := kafkapub.NewPublisher(b.client(t), kafkapub.PublisherConfig{MaxMessageBytes: tc.override})
				run(t, b.relayer(t, func(c *relay.Config) { c.Publisher = pub; c.HoldOut = 200 * time.Millisecond; c.BatchSize = 500 }))
			}
			want := append([]int64{big}, behind...)
			require.Eventually(t, func() bool { return slices.Equal(b.pendingIDs(t), want) }, 30*time.Second, 20*time.Millisecond,
				"only the big row and the %d rows behind it should stay pending", len(behind))
			// Several hold cycles: the big row is retried and fails again,
			// and nothing else is ever held or pending.
			require.Eventually(t, func() bool {
				h := b.holds(t)
				return len(h) == 1 && h[0].Attempts >= 3
			}, 30*time.Second, 20*time.Millisecond, "the big row should be retried and held again, alone")
			require.Equal(t, want, b.pendingIDs(t))
			h := b.holds(t)[0]
			require.Equal(t, big, h.EventID)
			require.Equal(t, relay.ReasonTooLarge, h.Reason)
			require.Contains(t, h.Err, "MESSAGE_TOO_LARGE")
			recs := b.consume(t, 2000-len(behind), 20*time.Second, "order")
			checkOrder(t, recs)
			for _, r := range recs {
				require.NotEqual(t, aggs[0].String(), r.Key, "no row of the held aggregate may overtake it")
			}
		})
	}
}

// client builds a publisher client on the bundle's broker.
func (b *bundle) client(t *testing.T) *kgo.Client {
	t.Helper()
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()},
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	return client
}

// Issue 9, defect 1, second half: with no oversized row at all, records of
// 9.6 kB that together exceed a 100 kB topic per partition failed on every
// retry, because the client's batches were up to 1 MB. Now batches are
// sized from the topic's limit as read from the broker; and on a client
// that was not built for it (batches of 1 MB), requests the broker refuses
// are split until they fit. Nothing is held either way.
func TestRecordsThatFitAloneButNotTogether(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		plain bool
	}{
		{"batches sized per topic", false},
		{"plain client, requests split", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, limitBroker())
			pub := kafkapub.NewPublisher(b.client(t), kafkapub.PublisherConfig{})
			if tc.plain {
				cl, err := kgo.NewClient(append(kafka.ProducerOptions(), kgo.SeedBrokers(b.broker.Addr()), kgo.ManualFlushing(),
					kgo.RecordDeliveryTimeout(5*time.Second))...)
				require.NoError(t, err)
				t.Cleanup(cl.Close)
				pub = kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{})
			}
			aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
			committed := map[int64]uuid.UUID{}
			for i := range 120 {
				agg := aggs[i%len(aggs)]
				committed[b.insertRaw(t, agg, "order.placed", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(9600)), "NULL")] = agg
			}
			r := b.relayer(t, func(c *relay.Config) { c.Publisher = pub })
			run(t, r)
			b.waitDrained(t, 30*time.Second)
			require.Empty(t, b.holds(t))
			require.Zero(t, r.Stats().PermanentFailures)
			checkDelivered(t, committed, b.consume(t, len(committed), 20*time.Second, "order"))
		})
	}
}

// Issue 9, defect 2: a row written by hand whose headers are valid JSONB
// but not an object of strings stopped every claim (a scan error for the
// whole batch), with no row named anywhere. Now the claim decodes each row
// on its own: the bad rows are held with their reason (undecodable, or
// reserved_header for a header the relayer sets itself), one log line
// names each, and every other row flows, before and after them. Since
// migration 6 a plain INSERT of such a row fails; these are rows written
// before it, which the relayer must still handle.
func TestUndecodableRowsHoldOnlyThemselves(t *testing.T) {
	t.Parallel()
	b := setup(t)
	committed := map[int64]uuid.UUID{}
	for range 50 {
		agg := uuid.New()
		committed[b.insertRaw(t, agg, "order.placed", `'{}'`, "NULL")] = agg
	}
	badAgg := uuid.New()
	bad := map[int64]string{
		b.insertLegacy(t, badAgg, "order.placed", `'{}'`, `'{"retries": 3}'`):            relay.ReasonUndecodable,
		b.insertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'[1, 2]'`):                relay.ReasonUndecodable,
		b.insertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'"text"'`):                relay.ReasonUndecodable,
		b.insertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'{"event_id": "1"}'`):     relay.ReasonReservedHeader,
		b.insertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'{"event_source": "x"}'`): relay.ReasonReservedHeader,
		b.insertLegacy(t, uuid.New(), "bad topic!.x", `'{}'`, "NULL"):                    relay.ReasonInvalidTopic,
	}
	behind := b.insertRaw(t, badAgg, "order.paid", `'{}'`, "NULL")
	for range 50 {
		agg := uuid.New()
		committed[b.insertRaw(t, agg, "order.placed", `'{}'`, `'{"trace": "abc"}'`)] = agg
	}
	committed[b.insertRaw(t, uuid.New(), "order.placed", `'{}'`, `'null'`)] = uuid.Nil // JSON null: no headers

	logs := &testlog.Buffer{}
	r := b.relayer(t, func(c *relay.Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	run(t, r)
	var want []int64
	for id := range bad {
		want = append(want, id)
	}
	want = append(want, behind)
	slices.Sort(want)
	require.Eventually(t, func() bool { return slices.Equal(b.pendingIDs(t), want) }, 20*time.Second, 20*time.Millisecond)
	holds := b.holds(t)
	require.Len(t, holds, len(bad), "one hold per bad row, none for the row behind one")
	for _, h := range holds {
		require.Equal(t, bad[h.EventID], h.Reason, "event %d: %s", h.EventID, h.Err)
		// The line is logged after the batch commits, so just after the
		// hold is visible.
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), fmt.Sprintf("event_id=%d", h.EventID)) },
			5*time.Second, 10*time.Millisecond, "a log line names the row %d", h.EventID)
	}
	require.Contains(t, logs.String(), "reason=undecodable")

	// The watchdog and the stats see them at once, each with its reason.
	rep, err := ops.Check(context.Background(), b.db.Pool, ops.WatchdogConfig{Tables: b.db.Tables})
	require.NoError(t, err)
	require.Equal(t, int64(len(bad)), rep.Held)
	require.Equal(t, int64(len(bad)+1), rep.Lag.Stuck)
	require.Equal(t, map[string]int64{relay.ReasonUndecodable: 3, relay.ReasonReservedHeader: 2, relay.ReasonInvalidTopic: 1}, rep.HeldByReason)
	for _, s := range rep.Stuck {
		if s.ID == behind {
			require.Equal(t, holds[0].EventID, s.BlockedBy)
			require.Empty(t, s.Reason)
			continue
		}
		require.Equal(t, bad[s.ID], s.Reason)
		require.NotEmpty(t, s.LastError)
	}

	recs := b.consume(t, len(committed), 20*time.Second, "order")
	require.Len(t, recs, len(committed))
	for _, rec := range recs {
		if rec.Headers["trace"] != "" {
			require.Equal(t, "abc", rec.Headers["trace"])
		}
	}
}

// Issue 9, defect 6: several rows of one aggregate fail in one batch (here
// all three are too large). Before, each failure overwrote the last, so the
// failures table named the aggregate's last row while the watchdog listed
// its first with no error. Now the failure belongs to the aggregate's first
// row; the rows behind it are listed as waiting for it; and the watchdog
// reports the held row as stuck at once, not after StuckAfter.
func TestFailureRecordedAgainstTheAggregatesFirstRow(t *testing.T) {
	t.Parallel()
	b := setup(t, limitBroker())
	agg := uuid.New()
	var ids []int64
	for range 3 {
		ids = append(ids, b.insertRaw(t, agg, "order.placed", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(150_000)), "NULL"))
	}
	// And a broker-side refusal of a whole request: the publisher is told
	// the limit is 1 MB, so it sends and the broker refuses.
	pub := kafkapub.NewPublisher(b.client(t), kafkapub.PublisherConfig{MaxMessageBytes: 1 << 20})
	other := uuid.New()
	var otherIDs []int64
	for range 3 {
		otherIDs = append(otherIDs, b.insertRaw(t, other, "payment.captured", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(150_000)), "NULL"))
	}
	run(t, b.relayer(t, nil))
	run(t, b.relayer(t, func(c *relay.Config) { c.Publisher = pub }))
	require.Eventually(t, func() bool { return len(b.holds(t)) == 2 }, 20*time.Second, 20*time.Millisecond)
	holds := b.holds(t)
	require.Equal(t, []int64{ids[0], otherIDs[0]}, []int64{holds[0].EventID, holds[1].EventID}, "each aggregate's first row takes the failure")

	rep, err := ops.Check(context.Background(), b.db.Pool, ops.WatchdogConfig{Tables: b.db.Tables})
	require.NoError(t, err)
	require.False(t, rep.Healthy(), "held rows are stuck at once")
	require.Equal(t, int64(6), rep.Lag.Stuck)
	require.Equal(t, int64(2), rep.Held)
	for _, s := range rep.Stuck {
		head := ids[0]
		if s.AggregateID == other {
			head = otherIDs[0]
		}
		if s.ID == head {
			require.Equal(t, relay.ReasonTooLarge, s.Reason)
			require.Contains(t, s.LastError, "MESSAGE_TOO_LARGE")
			require.Zero(t, s.BlockedBy)
			continue
		}
		require.Equal(t, head, s.BlockedBy)
		require.Empty(t, s.LastError, "a row behind the failed one has no failure of its own")
	}
	s, err := ops.ReadStats(context.Background(), b.db.Pool, b.db.Tables, ops.DefaultStuckAfter)
	require.NoError(t, err)
	require.Equal(t, rep.Held, s.Held, "stats and watchdog agree")
	require.Equal(t, rep.Lag.Stuck, s.Stuck)
}

// Holds live in the database: a row one relayer held is not retried by
// another before the hold ends, and each retry doubles the hold, with
// jitter so that holds recorded together drift apart.
func TestHoldsAreSharedAndBackOff(t *testing.T) {
	t.Parallel()
	b := setup(t, limitBroker())
	var big []int64
	for range 4 {
		big = append(big, b.insertRaw(t, uuid.New(), "order.placed", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(120_000)), "NULL"))
	}
	for range 3 {
		run(t, b.relayer(t, func(c *relay.Config) { c.HoldOut = 400 * time.Millisecond; c.MaxHoldOut = 800 * time.Millisecond }))
	}
	require.Eventually(t, func() bool { return len(b.holds(t)) == 4 }, 10*time.Second, 10*time.Millisecond)
	first := b.holds(t)
	// Within the first hold (at least 360 ms with jitter) no relayer tries
	// again, though three are polling every 50 ms.
	time.Sleep(250 * time.Millisecond)
	var dbNow time.Time
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT now()").Scan(&dbNow))
	for i, h := range b.holds(t) {
		if dbNow.Before(first[i].Until) {
			require.Equal(t, 1, h.Attempts, "event %d retried while held", h.EventID)
		}
	}
	require.Eventually(t, func() bool {
		for _, h := range b.holds(t) {
			if h.Attempts < 3 {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond)
	later := b.holds(t)
	ends := map[time.Time]bool{}
	for i, h := range later {
		require.Equal(t, first[i].EventID, h.EventID)
		ends[h.Until] = true
	}
	require.Len(t, ends, len(later), "holds recorded together end at different times")
	require.Equal(t, big, b.pendingIDs(t))
	var ids []string
	for _, id := range big {
		ids = append(ids, fmt.Sprint(id))
	}
	t.Logf("held %s; attempts and ends: %v", strings.Join(ids, ","), later)
}
