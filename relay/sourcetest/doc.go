// Package sourcetest is the conformance suite every relay source passes:
// the order, crash and poison-event scenarios, written once against a
// Source that each source's tests plug in (the polling relay in package
// relay, the WAL source in relay/walrelay), and that a source written
// outside this module plugs in the same way. The scenarios publish with
// the Kafka publisher (relay/kafkapub) on an embedded dev broker of their
// own; the sink side has its own suite, relay/sinktest.
//
// What the scenarios assert is what every source guarantees: every
// committed event reaches the broker at least once, nothing else does,
// each aggregate's events arrive in commit order within one partition,
// and an event the broker can never take is not published and is set
// aside where an operator sees it. Where the sources truly differ (the
// polling relay holds a poison event and keeps its aggregate's later
// events back; the WAL source parks it and goes on) the Source says so,
// and the suite checks each side of the difference exactly.
//
//	func TestConformance(t *testing.T) {
//		t.Parallel()
//		sourcetest.Run(t, sourcetest.Source{
//			Name: "poll",
//			Open: func(t *testing.T) *sourcetest.DB { return sourcetest.NewDB(t, "") },
//			Start: func(t *testing.T, db *sourcetest.DB, pub relay.Sink, cfg sourcetest.RelayerConfig) *sourcetest.Relayer {
//				r, err := relay.New(relay.Config{Common: relay.Common{Pool: db.Pool, Sink: pub, Tables: db.Tables, BatchSize: cfg.BatchSize, Contracts: cfg.Contracts}})
//				require.NoError(t, err)
//				return sourcetest.Background(t, db, r.Run, appNames, stats)
//			},
//			Unacked: ..., Sidelined: ..., Holds: true,
//		})
//	}
//
// The scenarios run in parallel, each with an outbox (Open) and a broker
// of its own; they need a Postgres server (DATABASE_URL, else the local
// test server).
package sourcetest
