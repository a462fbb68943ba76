//go:build race

package relay_test

// raceEnabled: the race detector's shadow memory multiplies a process's
// resident set, so resident-set bounds hold only without it.
const raceEnabled = true
