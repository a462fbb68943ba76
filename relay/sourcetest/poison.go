package sourcetest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/internal/testlog"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// poisonCase is what a poison scenario wrote, and what it expects.
type poisonCase struct {
	// healthy events are published, whatever the source.
	healthy map[int64]event
	// poison events are never published: each is sidelined with this
	// reason.
	poison map[int64]string
	// behind are the events written after a poison event of their
	// aggregate: they wait, pending, behind it in a source that Holds, and
	// are published in one that does not. blockedBy names that event.
	behind    map[int64]event
	blockedBy map[int64]int64
	topics    []string
	// errContains, when set, is in every poison event's recorded error.
	errContains string
	// retries, for a source that Holds, is how often each poison event
	// must have failed (hold cycles passed, nothing else held meanwhile).
	retries int
	// logs, when set, is where the relayers log: a line names each poison
	// event.
	logs *testlog.Buffer
}

func newPoisonCase(topics ...string) *poisonCase {
	return &poisonCase{healthy: map[int64]event{}, poison: map[int64]string{}, behind: map[int64]event{}, blockedBy: map[int64]int64{}, topics: topics}
}

// waitSidelined waits until the source set aside exactly the poison
// events, each for its reason, and returns what it recorded.
func (e *env) waitSidelined(t *testing.T, pc *poisonCase) map[int64]Sidelined {
	t.Helper()
	var got map[int64]Sidelined
	waitFor(30*time.Second, func() bool {
		got = e.src.Sidelined(t, e.db)
		return maps.Equal(reasons(got), pc.poison)
	})
	require.Equal(t, pc.poison, reasons(got), "%s: the events set aside, and why", e.src.Name)
	for id, s := range got {
		if pc.errContains != "" {
			require.Contains(t, s.Err, pc.errContains, "event %d", id)
		}
	}
	return got
}

func reasons(s map[int64]Sidelined) map[int64]string {
	out := make(map[int64]string, len(s))
	for id, x := range s {
		out[id] = x.Reason
	}
	return out
}

// checkPoison asserts what every source guarantees around poison events,
// and each side of where they differ:
//   - the source sets aside exactly the poison events, each with its
//     reason, where an operator sees them (Sidelined);
//   - a source that Holds keeps them and the events behind them pending,
//     and nothing else, through retries; one that does not publishes the
//     events behind them;
//   - the broker gets exactly the healthy events (and, unless the source
//     Holds, those behind), once each, in per-aggregate order: a poison
//     event never;
//   - once the relayers stop, what is left to publish is exactly the held
//     events and those behind them (a source that Holds), or nothing.
//
// It returns the records read back.
func (e *env) checkPoison(t *testing.T, pc *poisonCase, rs []*Relayer) []record {
	t.Helper()
	src := e.src
	e.waitSidelined(t, pc)
	want := maps.Clone(pc.healthy)
	waiting := map[int64]bool{} // what a source that Holds leaves pending
	if src.Holds {
		for id := range pc.poison {
			waiting[id] = true
		}
		for id := range pc.behind {
			waiting[id] = true
		}
		e.waitUnacked(t, sortedKeys(waiting), 30*time.Second, "only the held events and those behind them wait")
		if pc.retries > 1 {
			ok := waitFor(30*time.Second, func() bool {
				got := src.Sidelined(t, e.db)
				require.Equal(t, pc.poison, reasons(got), "%s: nothing else is held, ever", src.Name)
				for _, s := range got {
					if s.Attempts < pc.retries {
						return false
					}
				}
				return true
			})
			require.True(t, ok, "%s: the held events should be tried again, and held again, %d times", src.Name, pc.retries)
			e.waitUnacked(t, sortedKeys(waiting), time.Second, "after retries, still only the held events and those behind them wait")
		}
	} else {
		maps.Copy(want, pc.behind)
	}
	recs := e.consume(t, len(want), 30*time.Second, pc.topics...)
	dups := e.checkDelivered(t, want, recs)
	require.Empty(t, dups, "%s: no event is published twice without a crash or a failure", src.Name)
	require.Equal(t, pc.poison, reasons(src.Sidelined(t, e.db)), "%s: the events set aside, once all else was published", src.Name)
	if pc.logs != nil {
		for id := range pc.poison {
			// The line is logged once the event is set aside, so just after
			// that is visible.
			require.Eventually(t, func() bool { return strings.Contains(pc.logs.String(), fmt.Sprintf("event_id=%d", id)) },
				5*time.Second, 10*time.Millisecond, "%s: a log line names the event %d", src.Name, id)
		}
		for _, reason := range pc.poison {
			require.Contains(t, pc.logs.String(), "reason="+reason)
		}
	}
	if src.CheckSidelined != nil {
		src.CheckSidelined(t, e.db, pc.poison, pc.blockedBy)
	}
	stopAll(rs)
	require.Equal(t, sortedKeys(waiting), append([]int64{}, src.Unacked(t, e.db)...),
		"%s: left to publish after a graceful stop", src.Name)
	return recs
}

// PoisonRow: an event the broker can never take (larger than the broker's
// message.max.bytes, which the publisher learns from the broker; inserted
// behind the producer's back) stops no other aggregate: every other
// aggregate keeps flowing, events emitted after it included; it is never
// published and is set aside with its reason; its aggregate's later event
// waits behind it (Holds) or goes out without it.
func PoisonRow(t *testing.T, src Source) {
	e := open(t, src, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "2000"}))
	pc := newPoisonCase("order")
	pc.errContains = "accepts at most 2000 (the broker's message.max.bytes)"
	poisoned := uuid.New()
	others := newAggregates(3)
	emit := func(agg uuid.UUID) (int64, event) {
		id := e.emit(t, agg, "order.placed", map[string]string{"agg": agg.String()})
		return id, event{agg: agg, seq: id}
	}
	emitOthers := func() {
		for _, o := range others {
			id, ev := emit(o)
			pc.healthy[id] = ev
		}
	}
	emitOthers()
	id, ev := emit(poisoned) // before the poison event: published
	pc.healthy[id] = ev
	poison := e.pg().InsertRaw(t, poisoned, "order.placed", `jsonb_build_object('blob', repeat('x', 5000))`, "NULL")
	pc.poison[poison] = relay.ReasonTooLarge
	after, ev := emit(poisoned)
	pc.behind[after], pc.blockedBy[after] = ev, poison
	emitOthers()

	rs := e.start(t, 1, RelayerConfig{})
	e.waitSidelined(t, pc)
	emitOthers() // the relayer keeps going for other aggregates
	recs := e.checkPoison(t, pc, rs)
	t.Logf("%s: poison event %d set aside; %d events published", src.Name, poison, len(recs))
}

// randomText is n hex characters of random bytes: a JSON string that no
// compression shrinks much.
func randomText(n int) string {
	raw := make([]byte, n/2+1)
	_, _ = rand.Read(raw)
	return hex.EncodeToString(raw)[:n]
}

// OversizedRow: one oversized event among 2,000 small ones, on a broker
// that takes 100,000 bytes. Only the big event is set aside, whether the
// publisher refuses it before sending (it learnt the broker's limit) or
// the broker refuses a whole request (here forced by a publisher told the
// limit is 1 MB): then the request is split until the big event fails
// alone. Two relayers run; a source that Holds goes through several hold
// cycles, and nothing but the big event and the events of its aggregate
// behind it is ever held or left pending.
func OversizedRow(t *testing.T, src Source) {
	for _, tc := range []struct {
		name     string
		override int
	}{
		{"refused before sending", 0},
		{"refused by the broker, request split", 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := open(t, src, limitBroker())
			pc := newPoisonCase("order")
			pc.errContains, pc.retries = "MESSAGE_TOO_LARGE", 3
			aggs := newAggregates(50)
			big := e.pg().InsertRaw(t, aggs[0], "order.placed", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(400_000)), "NULL")
			pc.poison[big] = relay.ReasonTooLarge
			for i := range 2000 {
				agg := aggs[i%len(aggs)]
				id := e.pg().InsertRaw(t, agg, "order.placed", fmt.Sprintf(`'{"n": %d}'`, i), "NULL")
				if agg == aggs[0] {
					pc.behind[id], pc.blockedBy[id] = event{agg: agg, seq: id}, big
				} else {
					pc.healthy[id] = event{agg: agg, seq: id}
				}
			}
			var rs []*Relayer
			for range 2 {
				pub := e.publisher(t, kafkapub.PublisherConfig{MaxMessageBytes: tc.override})
				rs = append(rs, src.Start(t, e.db, pub, RelayerConfig{HoldOut: 200 * time.Millisecond, BatchSize: 500}))
			}
			recs := e.checkPoison(t, pc, rs)
			t.Logf("%s: big event %d set aside, %d behind it; %d events published", src.Name, big, len(pc.behind), len(recs))
		})
	}
}

// RecordsThatFitAloneButNotTogether: with no oversized event at all,
// records of 9.6 kB that together exceed a 100 kB topic per partition are
// all published: batches are sized from the topic's limit as read from
// the broker; and on a client that was not built for it (batches of
// 1 MB), requests the broker refuses are split until they fit. Nothing is
// set aside either way.
func RecordsThatFitAloneButNotTogether(t *testing.T, src Source) {
	for _, tc := range []struct {
		name  string
		plain bool
	}{
		{"batches sized per topic", false},
		{"plain client, requests split", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := open(t, src, limitBroker())
			pub := e.publisher(t, kafkapub.PublisherConfig{})
			if tc.plain {
				cl, err := kgo.NewClient(append(kafka.ProducerOptions(), kgo.SeedBrokers(e.broker.Addr()), kgo.ManualFlushing(),
					kgo.RecordDeliveryTimeout(5*time.Second))...)
				require.NoError(t, err)
				t.Cleanup(cl.Close)
				pub = e.publisherOn(cl, kafkapub.PublisherConfig{})
			}
			pc := newPoisonCase("order")
			aggs := newAggregates(3)
			for i := range 120 {
				agg := aggs[i%len(aggs)]
				id := e.pg().InsertRaw(t, agg, "order.placed", fmt.Sprintf(`jsonb_build_object('blob', '%s'::text)`, randomText(9600)), "NULL")
				pc.healthy[id] = event{agg: agg, seq: id}
			}
			r := src.Start(t, e.db, pub, RelayerConfig{})
			e.checkPoison(t, pc, []*Relayer{r})
		})
	}
}

// UndecodableRows: rows written by hand whose headers are valid JSONB but
// not an object of strings, or use a header the relayer sets itself, or
// whose type routes to no valid topic, are set aside on their own, each
// with its reason, and one log line names each; every other row flows,
// before and after them. Since migration 6 a plain INSERT of such a row
// fails; these are rows written before it, which every source must still
// handle.
func UndecodableRows(t *testing.T, src Source) {
	e := open(t, src)
	pc := newPoisonCase("order")
	pc.logs = &testlog.Buffer{}
	healthy := func(agg uuid.UUID, headers string) {
		id := e.pg().InsertRaw(t, agg, "order.placed", `'{}'`, headers)
		pc.healthy[id] = event{agg: agg, seq: id}
	}
	for range 50 {
		healthy(uuid.New(), "NULL")
	}
	badAgg := uuid.New()
	first := e.pg().InsertLegacy(t, badAgg, "order.placed", `'{}'`, `'{"retries": 3}'`)
	pc.poison[first] = relay.ReasonUndecodable
	pc.poison[e.pg().InsertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'[1, 2]'`)] = relay.ReasonUndecodable
	pc.poison[e.pg().InsertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'"text"'`)] = relay.ReasonUndecodable
	pc.poison[e.pg().InsertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'{"event_id": "1"}'`)] = relay.ReasonReservedHeader
	pc.poison[e.pg().InsertLegacy(t, uuid.New(), "order.placed", `'{}'`, `'{"event_source": "x"}'`)] = relay.ReasonReservedHeader
	pc.poison[e.pg().InsertLegacy(t, uuid.New(), "bad topic!.x", `'{}'`, "NULL")] = relay.ReasonInvalidTopic
	behind := e.pg().InsertRaw(t, badAgg, "order.paid", `'{}'`, "NULL")
	pc.behind[behind], pc.blockedBy[behind] = event{agg: badAgg, seq: behind}, first
	for range 50 {
		healthy(uuid.New(), `'{"trace": "abc"}'`)
	}
	healthy(uuid.New(), `'null'`) // JSON null: no headers

	r := src.Start(t, e.db, e.publisher(t, kafkapub.PublisherConfig{}), RelayerConfig{Logger: slog.New(slog.NewTextHandler(pc.logs, nil))})
	recs := e.checkPoison(t, pc, []*Relayer{r})
	traced := 0
	for _, rec := range recs {
		if rec.Headers["trace"] != "" {
			require.Equal(t, "abc", rec.Headers["trace"])
			traced++
		}
	}
	require.Equal(t, 50, traced, "the rows' own headers are published")
}
