package sourcetest

import "testing"

// Scenario is one shared scenario: Run asserts it against a source.
type Scenario struct {
	Name string
	Run  func(t *testing.T, src Source)
}

// Scenarios lists every shared scenario, in the suites they came from:
// order, crash, poison. Each applies to every source: where the sources'
// promises differ (a poison event held or parked, replicas sharing the
// work or standing by, acknowledgements per batch or at intervals), the
// scenario checks each side as the Source describes it.
var Scenarios = []Scenario{
	{"Order", Order},
	{"CrashBetweenPublishAndAck", CrashBetweenPublishAndAck},
	{"BrokerFaults", BrokerFaults},
	{"FailedProduceNoOvertake", FailedProduceNoOvertake},
	{"StopWhileStarting", StopWhileStarting},
	{"PoisonRow", PoisonRow},
	{"OversizedRow", OversizedRow},
	{"RecordsThatFitAloneButNotTogether", RecordsThatFitAloneButNotTogether},
	{"UndecodableRows", UndecodableRows},
	{"ContractViolations", ContractViolations},
	{"ContractRequired", ContractRequired},
	{"PublishPathProperty", PublishPathProperty},
}

// Run runs every scenario against src, each as a parallel subtest on an
// outbox and a broker of its own, but those src lists as KnownDefects.
func Run(t *testing.T, src Source) {
	for _, sc := range Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			if why, ok := src.KnownDefects[sc.Name]; ok {
				t.Skipf("known defect: %s fails %s: %s", src.Name, sc.Name, why)
			}
			sc.Run(t, src)
		})
	}
}
