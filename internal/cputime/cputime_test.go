package cputime_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/cputime"
)

// Both readers see this process spend CPU; /proc's in clock ticks, so
// the spin is long enough to move it.
func TestReadersSeeCPUSpent(t *testing.T) {
	self0 := cputime.Self()
	proc0, err := cputime.Process(os.Getpid())
	require.NoError(t, err)
	// Spin until Self says 200ms were spent (or 20s pass: it says
	// nothing), then /proc must say at least half as much.
	for start := time.Now(); cputime.Self()-self0 < 200*time.Millisecond; {
		require.Less(t, time.Since(start), 20*time.Second, "Self did not move")
	}
	proc1, err := cputime.Process(os.Getpid())
	require.NoError(t, err)
	require.Greater(t, proc1-proc0, 100*time.Millisecond)

	_, err = cputime.Process(-1)
	require.Error(t, err, "no such process")
}

// Running counts in nanoseconds: a spin of 20 ms, two ticks of /proc's
// stat, shows as about that much.
func TestRunningSeesMilliseconds(t *testing.T) {
	run0, err := cputime.Running(os.Getpid())
	require.NoError(t, err)
	self0 := cputime.Self()
	for start := time.Now(); cputime.Self()-self0 < 20*time.Millisecond; {
		require.Less(t, time.Since(start), 20*time.Second, "Self did not move")
	}
	run1, err := cputime.Running(os.Getpid())
	require.NoError(t, err)
	require.Greater(t, run1-run0, 10*time.Millisecond)

	_, err = cputime.Running(-1)
	require.Error(t, err, "no such process")
}
