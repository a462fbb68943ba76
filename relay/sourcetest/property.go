package sourcetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// PublishPathProperty: the whole publish path against rows of any shape,
// written by plain SQL as any producer may: types with any characters,
// JSONB headers and payloads of any shape, sizes from nothing to 2 MB,
// aggregates that collide, mixed with healthy rows. The insert guard
// (migration 6) must refuse exactly the rows guardOracle says it refuses;
// those are then written as rows from before the migration, so the
// relayers meet them all; three relayers; a broker that takes 100,000
// bytes. An oracle written from the wire contract (not from any relayer's
// code) says which rows can be published.
//
// A source that Holds is checked round by round: every publishable row
// that no unpublishable row of its aggregate precedes reaches the broker;
// every unpublishable row at the head of its aggregate is held, with its
// reason, and nothing else is; the rows behind a held row wait. Then the
// held rows are parked by the operator verb, and the next round begins,
// until nothing is pending. A source that does not hold sets every
// unpublishable row aside at once, with its reason, and publishes every
// other.
//
// Either way, in the end the broker has every publishable row, byte-exact,
// under its key, in per-aggregate order, and no other.
//
// OUTBOX_PROPERTY_ROWS sets the number of rows (default 400, the version
// CI runs), OUTBOX_PROPERTY_SEED the seed (default: random, logged).
func PublishPathProperty(t *testing.T, src Source) {
	rows := envInt(t, "OUTBOX_PROPERTY_ROWS", 400)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("OUTBOX_PROPERTY_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("%s: OUTBOX_PROPERTY_SEED=%d OUTBOX_PROPERTY_ROWS=%d", src.Name, seed, rows)
	rnd := rand.New(rand.NewPCG(seed, 9))

	e := open(t, src, limitBroker())
	all := e.writePropertyRows(t, rnd, rows)
	var rs []*Relayer
	for range 3 {
		rs = append(rs, e.src.Start(t, e.db, e.publisher(t, kafkapub.PublisherConfig{}), RelayerConfig{HoldOut: time.Second, BatchSize: 50 + rnd.IntN(200)}))
	}
	var published map[int64]bool
	var sidelined map[int64]string
	if src.Holds {
		published, sidelined = e.checkHeldRounds(t, all)
	} else {
		published, sidelined = e.checkSetAside(t, all)
	}
	e.checkPublishedRows(t, all, published)
	stopAll(rs)
	require.Empty(t, src.Unacked(t, e.db), "%s: left to publish after a graceful stop", src.Name)
	byReason := map[string]int{}
	for _, r := range all {
		byReason[r.reason]++
	}
	t.Logf("%s: %d rows: %d published, %d set aside; by reason: %v", src.Name, len(all), len(published), len(sidelined), byReason)
}

// propertyLimit is the property broker's message.max.bytes (limitBroker).
const propertyLimit = 100_000

// propertyRow is a row the property wrote, and what the oracle says of it.
type propertyRow struct {
	id      int64
	agg     uuid.UUID
	typ     string
	payload string // as stored: payload::text
	reason  string // why it cannot be published; "" when it can
}

// writePropertyRows writes n random rows on 12 aggregates by plain SQL.
// The insert guard (migration 6) must refuse exactly the rows guardOracle
// says it refuses; such a row is then written as one from before the
// migration, which the relayers must still handle.
func (e *env) writePropertyRows(t *testing.T, rnd *rand.Rand, n int) []*propertyRow {
	t.Helper()
	ctx := context.Background()
	aggs := newAggregates(12)
	var all []*propertyRow
	refused := map[string]int{}
	insert := `INSERT INTO ` + e.db.Tables.OutboxIdent() + ` (aggregate_id, type, payload, headers) VALUES ($1, $2, $3::jsonb, NULLIF($4, '')::jsonb) RETURNING id, payload::text`
	for range n {
		r := &propertyRow{agg: aggs[rnd.IntN(len(aggs))], typ: randomType(rnd)}
		payload, headers := randomPayload(rnd), randomHeaders(rnd)
		err := e.db.Pool.QueryRow(ctx, insert, r.agg, r.typ, payload, headers).Scan(&r.id, &r.payload)
		if rule := guardOracle(r.typ, headers); rule != "" {
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "type %q headers %.100s: the guard should refuse it (%s): %v", r.typ, headers, rule, err)
			require.Equal(t, "23514", pgErr.Code)
			require.Equal(t, e.db.Tables.Outbox+"_"+rule, pgErr.ConstraintName, "type %q headers %.100s", r.typ, headers)
			refused[rule]++
			e.pg().WriteLegacy(t, func(ctx context.Context, tx pgx.Tx) error {
				return tx.QueryRow(ctx, insert, r.agg, r.typ, payload, headers).Scan(&r.id, &r.payload)
			})
		} else {
			require.NoError(t, err, "type %q payload %.100s headers %.100s", r.typ, payload, headers)
		}
		r.reason = oracle(r.id, r.typ, r.payload, headers, e.src.EventSource, propertyLimit)
		all = append(all, r)
	}
	t.Logf("refused at insert, then written as rows from before migration 6: %v", refused)
	return all
}

// checkHeldRounds checks a source that holds, round by round: per
// aggregate, the rows up to its first unpublishable row go out, that row
// is held with its reason, the rest wait; then the held rows are parked
// and the next round begins, until nothing is held. It returns the rows
// published and the rows parked, with their reasons.
func (e *env) checkHeldRounds(t *testing.T, all []*propertyRow) (published map[int64]bool, sidelined map[int64]string) {
	t.Helper()
	published, sidelined = map[int64]bool{}, map[int64]string{}
	parked := map[int64]bool{}
	for round := 1; ; round++ {
		wantHeld, wantPending := expectRound(all, parked, published)
		var pending []int64
		var held map[int64]string
		waitFor(60*time.Second, func() bool {
			pending = e.src.Unacked(t, e.db)
			held = reasons(e.src.Sidelined(t, e.db))
			return slices.Equal(pending, wantPending) && maps.Equal(held, wantHeld)
		})
		require.Equal(t, wantPending, append([]int64(nil), pending...), "round %d: pending rows", round)
		require.Equal(t, wantHeld, held, "round %d: held rows and their reasons", round)
		t.Logf("round %d: %d published so far, %d held (%v), %d pending", round, len(published), len(held), reasonCounts(held), len(pending))
		if len(wantHeld) == 0 {
			return published, sidelined
		}
		for id, reason := range wantHeld {
			res, err := ops.Park(context.Background(), e.db.Pool, ops.ParkConfig{Tables: e.db.Tables, ID: id, Reason: "property test", Apply: true})
			require.NoError(t, err)
			require.True(t, res.Applied)
			parked[id] = true
			sidelined[id] = reason
		}
	}
}

// expectRound is what the oracle expects of a holding source once the
// rows parked are out of the way: per aggregate, the rows up to its first
// unpublishable row go out (added to published); that row is held (with
// its reason, in held); it and the rest of the aggregate's rows are
// pending.
func expectRound(all []*propertyRow, parked, published map[int64]bool) (held map[int64]string, pending []int64) {
	held = map[int64]string{}
	blocked := map[uuid.UUID]bool{}
	for _, r := range all {
		switch {
		case parked[r.id]:
		case blocked[r.agg]:
			pending = append(pending, r.id)
		case r.reason != "":
			blocked[r.agg] = true
			held[r.id] = r.reason
			pending = append(pending, r.id)
		default:
			published[r.id] = true
		}
	}
	return held, pending
}

// checkSetAside checks a source that does not hold: every unpublishable
// row is set aside at once, with its reason, and no other. It returns the
// rows to be published and the rows set aside, with their reasons.
func (e *env) checkSetAside(t *testing.T, all []*propertyRow) (published map[int64]bool, sidelined map[int64]string) {
	t.Helper()
	published = map[int64]bool{}
	want := map[int64]string{}
	for _, r := range all {
		if r.reason != "" {
			want[r.id] = r.reason
		} else {
			published[r.id] = true
		}
	}
	var got map[int64]string
	waitFor(60*time.Second, func() bool {
		got = reasons(e.src.Sidelined(t, e.db))
		return maps.Equal(got, want)
	})
	require.Equal(t, want, got, "every unpublishable row is set aside at once, with its reason, and no other")
	return published, got
}

// checkPublishedRows checks that the broker has every published row,
// byte-exact, under its key, in per-aggregate order, and no other.
func (e *env) checkPublishedRows(t *testing.T, all []*propertyRow, published map[int64]bool) {
	t.Helper()
	topics := map[string]bool{}
	for _, r := range all {
		if r.reason == "" {
			topic, _ := outbox.KafkaRouting{}.Destination(r.typ)
			topics[topic] = true
		}
	}
	recs := e.consume(t, len(published), 60*time.Second, slices.Collect(maps.Keys(topics))...)
	byID := map[int64]*propertyRow{}
	for _, r := range all {
		byID[r.id] = r
	}
	got := map[int64]bool{}
	for _, rec := range recs {
		r := byID[rec.EventID]
		require.NotNil(t, r, "record with event_id %d", rec.EventID)
		require.True(t, published[r.id], "event %d reached the broker but should not have (%s)", r.id, r.reason)
		require.Equal(t, r.agg.String(), rec.Key)
		require.Equal(t, r.payload, rec.Value, "event %d: the published value is the stored payload", r.id)
		require.Equal(t, r.typ, rec.Headers[outbox.HeaderEventType])
		require.Equal(t, e.src.EventSource, rec.Headers[outbox.HeaderEventSource])
		got[r.id] = true
	}
	require.Equal(t, len(published), len(got), "every publishable row reached the broker")
	// Order holds per aggregate within a topic: the types of one aggregate
	// may route to several topics, which Kafka does not order together.
	committed := map[int64]event{}
	for _, r := range all {
		committed[r.id] = event{agg: r.agg, seq: r.id}
	}
	byTopic := map[string][]record{}
	for _, rec := range recs {
		byTopic[rec.Topic] = append(byTopic[rec.Topic], rec)
	}
	for _, inTopic := range byTopic {
		checkOrder(t, committed, inTopic)
	}
}

// oracle says why a row cannot be published, or "": the wire contract, in
// the relayers' order of checks (its headers, its type's topic, then the
// record's size, with the publisher's event_source header, against the
// broker's limit).
func oracle(id int64, typ, payload, headers, source string, limit int) string {
	var h map[string]string
	if headers != "" && headers != "null" {
		var raw map[string]*string
		if err := json.Unmarshal([]byte(headers), &raw); err != nil {
			return relay.ReasonUndecodable
		}
		h = map[string]string{}
		for k, v := range raw {
			if k == "" || v == nil {
				return relay.ReasonUndecodable
			}
			h[k] = *v
		}
		for k := range h {
			if outbox.IsReservedHeader(k) {
				return relay.ReasonReservedHeader
			}
		}
	}
	if _, err := (outbox.KafkaRouting{}).Destination(typ); err != nil {
		return relay.ReasonInvalidTopic
	}
	if (outbox.KafkaRouting{}).RecordSize(id, typ, len(payload), h, source) > limit {
		return relay.ReasonTooLarge
	}
	return ""
}

// guardOracle says which rule of the insert guard (migration 6) refuses a
// plain INSERT of the row, or "": from the contract, in the guard's order
// (the type, then the headers). The type's topic must be valid with no
// prefix; the headers SQL NULL, JSON null, or an object of string values
// whose names are neither empty nor reserved: what the relayers decode
// (the relay's header decoding), refusing at insert what they would set aside.
func guardOracle(typ, headers string) string {
	if _, err := (outbox.KafkaRouting{}).Destination(typ); err != nil {
		return "type_topic"
	}
	if headers == "" || headers == "null" {
		return ""
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal([]byte(headers), &raw) != nil {
		return "headers_shape"
	}
	for k, v := range raw {
		var s string
		if k == "" || outbox.IsReservedHeader(k) || len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
			return "headers_shape"
		}
	}
	return ""
}

func reasonCounts(held map[int64]string) map[string]int {
	out := map[string]int{}
	for _, r := range held {
		out[r]++
	}
	return out
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "%s=%q", name, s)
	return n
}

// randomType is mostly a valid "topic.event" type, sometimes one whose
// topic Kafka refuses, whose suffix holds any characters, or that is long.
func randomType(rnd *rand.Rand) string {
	topics := []string{"order", "pay-ment", "audit_log", "v2.x"}
	topic := topics[rnd.IntN(len(topics))]
	switch rnd.IntN(30) {
	case 0:
		return "bad topic." + topic
	case 1:
		return ".leading"
	case 2:
		return "ünïcode.placed"
	case 3:
		return ""
	case 4:
		return topic + ".\t\"quoted\" \\ ✓ " + strings.Repeat("ß", rnd.IntN(50))
	case 5:
		return topic + "." + strings.Repeat("x", rnd.IntN(120_000))
	case 6:
		return topic // no suffix at all
	}
	return topic + ".placed"
}

// randomHeaders is a JSONB value of any shape, as text ("" for SQL NULL).
func randomHeaders(rnd *rand.Rand) string {
	switch rnd.IntN(40) {
	case 0:
		return ""
	case 1:
		return "null"
	case 2:
		return "{}"
	case 3:
		return `{"retries": 3}`
	case 4:
		return `{"k": null}`
	case 5:
		return `["a", "b"]`
	case 6:
		return `"text"`
	case 7:
		return `{"event_id": "7"}`
	case 8:
		return `{"content-type": "text/plain", "x": "y"}`
	case 9:
		return `{"nested": {"a": "b"}}`
	case 10:
		return fmt.Sprintf(`{"big": "%s"}`, strings.Repeat("h", rnd.IntN(150_000)))
	case 11:
		return `{"trace": "00-abc-01", "ünï": "✓ \"q\""}`
	}
	return ""
}

// randomPayload is a JSON value of any shape and size, from nothing to
// 2 MB, often near the broker's limit.
func randomPayload(rnd *rand.Rand) string {
	switch rnd.IntN(20) {
	case 0:
		return "null"
	case 1:
		return `"just a string"`
	case 2:
		return "[]"
	case 3:
		return fmt.Sprintf("%d.%d", rnd.Int64(), rnd.IntN(1000))
	case 4:
		return `{"b": 1, "a": [1, 2, {"c": "✓"}], "a": "dup"}`
	case 5: // around the limit
		return fmt.Sprintf(`{"blob": "%s"}`, strings.Repeat("p", 99_000+rnd.IntN(2_000)))
	case 6:
		return fmt.Sprintf(`{"blob": "%s"}`, strings.Repeat("p", rnd.IntN(100_000)))
	case 7:
		return fmt.Sprintf(`{"blob": "%s"}`, strings.Repeat("p", rnd.IntN(2_000_000)))
	case 8: // expands when stored: [0,0,...] becomes [0, 0, ...]
		return "[" + strings.Repeat("0,", rnd.IntN(60_000)) + "0]"
	}
	return fmt.Sprintf(`{"n": %d, "s": "%s"}`, rnd.IntN(1000), strings.Repeat("s", rnd.IntN(200)))
}
