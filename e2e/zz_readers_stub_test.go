package e2e_test

// Temporary stand-ins for the read_committed readers of
// e2e/readcommitted_test.go (written elsewhere), so that this package
// compiles on its own: DELETE before merging.

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
)

func readCommittedStub(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered {
	t.Helper()
	var out []delivered
	for _, r := range kafkatest.ReadCommitted(t, addr, timeout, kafkatest.AtLeastThenQuiet(want, 2*time.Second), topic) {
		out = append(out, delivered{key: string(r.Key), partition: r.Partition, id: kafkatest.EventID(r),
			at: r.Timestamp, source: kafkatest.Headers(r)[outbox.HeaderEventSource]})
	}
	return out
}

func readCommittedKcat(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered {
	return readCommittedStub(t, addr, topic, want, timeout)
}

func readCommittedPython(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered {
	return readCommittedStub(t, addr, topic, want, timeout)
}

func exactlyOnce(t *testing.T, committed map[uuid.UUID][]int64, got []delivered) (lost, dups int) {
	t.Helper()
	dups = verify(t, committed, got)
	require.Zero(t, dups, "duplicates")
	return 0, dups
}
