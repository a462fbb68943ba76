package sourcetest

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/contracts"
	"github.com/pgoutbox/outbox/internal/testlog"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// Contracts of the contract scenarios: order.placed has two versions,
// payment.captured none.
const (
	orderV1 = `{"type": "object", "required": ["order_id"],
  "properties": {"order_id": {"type": "string"}}}`
	orderV2 = `{"type": "object", "required": ["order_id", "total_cents"],
  "properties": {"order_id": {"type": "string"}, "total_cents": {"type": "integer", "minimum": 0}}}`
)

// loadContracts writes files (path: content) into a directory and loads
// it as a contracts set.
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

// emitVersion commits one event with Emit (a producer without contracts,
// so unchecked) naming version: its event_version header.
func (e *env) emitVersion(t *testing.T, agg uuid.UUID, typ string, version int, payload string) int64 {
	t.Helper()
	var id int64
	err := pgx.BeginFunc(context.Background(), e.db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = e.producer.Emit(context.Background(), tx, outbox.Event{AggregateID: agg, Type: typ, Version: version, Payload: []byte(payload)})
		return err
	})
	require.NoError(t, err)
	return id
}

// ContractViolations: with contracts, rows written by plain SQL (or by a
// producer that checks nothing) that break their type's contract are set
// aside before sending with reason contract, one log line naming each,
// their error naming the JSON pointer and the rule: a payload that breaks
// the latest version, one that breaks the version its event_version
// header names, a header naming a version the contract lacks, and one
// that is no version at all. Their aggregates' later events wait behind
// them (Holds) or go out without them; every other event flows, other
// aggregates and a type without a contract alike. What passes is sent
// with an event_version header: the row's own, or the version it was
// checked against when it had none; a type without a contract is sent
// unchanged, whatever its headers say.
func ContractViolations(t *testing.T, src Source) {
	e := open(t, src)
	set := loadContracts(t, map[string]string{"order.placed/v1.schema.json": orderV1, "order.placed/v2.schema.json": orderV2})
	pc := newPoisonCase("order", "payment")
	pc.logs = &testlog.Buffer{}
	pc.errContains = "then retry the event" // every message says what to do
	version := map[int64]string{}           // the event_version header each published event carries ("": none)
	good := func(typ, payload, headers, want string) {
		agg := uuid.New()
		id := e.pg().InsertRaw(t, agg, typ, payload, headers)
		pc.healthy[id], version[id] = event{agg: agg, seq: id}, want
	}
	// Enough rows for a batch that the polling relay checks on several
	// goroutines (64 rows each).
	for range 50 {
		good("order.placed", `'{"order_id": "a", "total_cents": 5}'`, "NULL", "2")
		good("order.placed", `'{"order_id": "a"}'`, `'{"event_version": "1", "trace": "x"}'`, "1")
		good("payment.captured", `'{"anything": [1]}'`, "NULL", "")
	}
	good("order.placed", `'{"order_id": "a", "total_cents": 5}'`, `'{"event_version": "2"}'`, "2")
	good("payment.captured", `'{}'`, `'{"event_version": "v1"}'`, "v1") // no contract: not read
	agg := uuid.New()
	id := e.emitVersion(t, agg, "order.placed", 1, `{"order_id": "b"}`)
	pc.healthy[id], version[id] = event{agg: agg, seq: id}, "1"

	// The violations: each aggregate has a good event before the bad one
	// and one after it.
	poison := func(payload, headers string) int64 {
		agg := uuid.New()
		before := e.pg().InsertRaw(t, agg, "order.placed", `'{"order_id": "c", "total_cents": 1}'`, "NULL")
		pc.healthy[before], version[before] = event{agg: agg, seq: before}, "2"
		bad := e.pg().InsertRaw(t, agg, "order.placed", payload, headers)
		pc.poison[bad] = relay.ReasonContract
		after := e.pg().InsertRaw(t, agg, "order.placed", `'{"order_id": "c", "total_cents": 2}'`, "NULL")
		pc.behind[after], pc.blockedBy[after] = event{agg: agg, seq: after}, bad
		version[after] = "2"
		return bad
	}
	wrongType := poison(`'{"order_id": "d", "total_cents": "ten"}'`, "NULL")
	missing := poison(`'{"total_cents": 3}'`, `'{"event_version": "1"}'`) // v1 wants order_id
	unknown := poison(`'{"order_id": "e"}'`, `'{"event_version": "7"}'`)
	notVersion := poison(`'{"order_id": "f", "total_cents": 1}'`, `'{"event_version": "v2"}'`)

	r := src.Start(t, e.db, e.publisher(t, kafkapub.PublisherConfig{}), RelayerConfig{Contracts: set, Logger: slog.New(slog.NewTextHandler(pc.logs, nil))})
	got := e.waitSidelined(t, pc)
	require.Contains(t, got[wrongType].Err, "order.placed v2: at /total_cents")
	require.Contains(t, got[wrongType].Err, "rule /properties/total_cents/type")
	require.Contains(t, got[missing].Err, "order.placed v1")
	require.Contains(t, got[missing].Err, "rule /required")
	require.Contains(t, got[unknown].Err, "order.placed v7; its contract has v1, v2")
	require.Contains(t, got[notVersion].Err, `header event_version is "v2", not a version`)
	recs := e.checkPoison(t, pc, []*Relayer{r})
	checkVersions(t, src, version, recs)
	t.Logf("%s: %d contract violations set aside; %d events published", src.Name, len(pc.poison), len(recs))
}

// ContractRequired: contracts that require one for every type set aside
// an event of a type without a contract, with reason contract and an
// error that says how to add one; events of types with a contract flow.
func ContractRequired(t *testing.T, src Source) {
	e := open(t, src)
	set := loadContracts(t, map[string]string{"contracts.json": `{"require": true}`, "order.placed/v1.schema.json": orderV1})
	pc := newPoisonCase("order", "payment")
	pc.errContains = `"payment.captured"; add payment.captured/v1.schema.json`
	version := map[int64]string{}
	for range 10 {
		agg := uuid.New()
		id := e.pg().InsertRaw(t, agg, "order.placed", `'{"order_id": "a"}'`, "NULL")
		pc.healthy[id], version[id] = event{agg: agg, seq: id}, "1"
	}
	agg := uuid.New()
	before := e.pg().InsertRaw(t, agg, "order.placed", `'{"order_id": "a"}'`, "NULL")
	pc.healthy[before], version[before] = event{agg: agg, seq: before}, "1"
	bad := e.pg().InsertRaw(t, agg, "payment.captured", `'{}'`, `'{"event_version": "1"}'`)
	pc.poison[bad] = relay.ReasonContract
	after := e.pg().InsertRaw(t, agg, "order.placed", `'{"order_id": "b"}'`, "NULL")
	pc.behind[after], pc.blockedBy[after], version[after] = event{agg: agg, seq: after}, bad, "1"
	// A header that is no version does not hide a missing contract.
	other := e.pg().InsertRaw(t, uuid.New(), "payment.captured", `'{}'`, `'{"event_version": "x"}'`)
	pc.poison[other] = relay.ReasonContract

	r := src.Start(t, e.db, e.publisher(t, kafkapub.PublisherConfig{}), RelayerConfig{Contracts: set})
	recs := e.checkPoison(t, pc, []*Relayer{r})
	checkVersions(t, src, version, recs)
}

// checkVersions asserts the event_version header of every record read
// back: want's, absent where want is "".
func checkVersions(t *testing.T, src Source, want map[int64]string, recs []record) {
	t.Helper()
	for _, rec := range recs {
		w, ok := want[rec.EventID]
		require.True(t, ok, "event %d was not expected", rec.EventID)
		got, has := rec.Headers[outbox.HeaderEventVersion]
		if w == "" {
			require.False(t, has, "%s: event %d of a type without a contract got an event_version header %q", src.Name, rec.EventID, got)
			continue
		}
		require.Equal(t, w, got, "%s: event %d's event_version header", src.Name, rec.EventID)
	}
}
