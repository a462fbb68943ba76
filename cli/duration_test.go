package cli

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseDaysTakesGoDurationsAndDays(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	for in, want := range map[string]time.Duration{
		"7d":     7 * day,
		"30d":    30 * day,
		"1.5d":   36 * time.Hour,
		".5d":    12 * time.Hour,
		"1d12h":  36 * time.Hour,
		"2d30m":  2*day + 30*time.Minute,
		"0d":     0,
		"-1d":    -day,
		"90m":    90 * time.Minute,
		"1h30m":  90 * time.Minute,
		"250ms":  250 * time.Millisecond,
		"-1s":    -time.Second,
		"0":      0,
		"168h":   7 * day,
		"+2d":    2 * day,
		"10000d": 10000 * day,
	} {
		got, err := parseDays(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "d", "7", "7x", "7dd", "1d-2h", "1e3d", "7 d", "200000d", "1d2", "d7"} {
		_, err := parseDays(in)
		require.Error(t, err, in)
	}
}

func TestFormatDaysReadsBack(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                                   "0s",
		7 * 24 * time.Hour:                  "7d",
		36 * time.Hour:                      "1d12h",
		24*time.Hour + 90*time.Second:       "1d1m30s",
		time.Hour:                           "1h",
		5 * time.Minute:                     "5m",
		100 * time.Millisecond:              "100ms",
		10 * time.Second:                    "10s",
		-48 * time.Hour:                     "-2d",
		25*time.Hour + 500*time.Millisecond: "1d1h0m0.5s",
	} {
		require.Equal(t, want, formatDays(d))
		back, err := parseDays(want)
		require.NoError(t, err, want)
		require.Equal(t, d, back, want)
	}
}
