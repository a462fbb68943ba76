// Package relaytest is the conformance suite every relay source passes:
// the order, crash and poison-event scenarios, written once against a
// Source that each source's tests plug in (the polling relay in package
// relay, the WAL source in relay/walrelay). Only _test.go files import it.
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
//		relaytest.Run(t, relaytest.Source{Name: "poll", Open: ..., Start: ..., ...})
//	}
package relaytest
