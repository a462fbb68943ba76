package e2e_test

// Temporary stand-ins for e2e/readcommitted_test.go (main), to compile on
// this branch; deleted before merging.

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatest"
)

func stubReadCommitted(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered {
	t.Helper()
	var out []delivered
	for _, r := range kafkatest.ReadCommitted(t, addr, timeout, kafkatest.AtLeastThenQuiet(want, 2*time.Second), topic) {
		out = append(out, delivered{key: string(r.Key), partition: r.Partition, id: kafkatest.EventID(r),
			at: r.Timestamp, source: kafkatest.Headers(r)[outbox.HeaderEventSource]})
	}
	return out
}

func readCommittedKcat(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered {
	return stubReadCommitted(t, addr, topic, want, timeout)
}

func readCommittedPython(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered {
	return stubReadCommitted(t, addr, topic, want, timeout)
}

func exactlyOnce(t *testing.T, committed map[uuid.UUID][]int64, got []delivered) (lost, dups int) {
	t.Helper()
	dups = verify(t, committed, got)
	require.Zero(t, dups)
	return 0, dups
}
