package cli

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// days is a time.Duration flag that also takes days: retention is thought
// of in days ("7d", "1.5d", "1d12h"), and Go's durations stop at hours. It
// prints whole days as days, so a help default reads "7d", not "168h0m0s".
type days struct{ d *time.Duration }

// durationVar registers a duration flag that takes days as well (see days).
// Every duration flag of the CLI goes through it, so all take the same forms.
func durationVar(f *pflag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	f.Var(days{p}, name, usage)
}

func (v days) Set(s string) error {
	d, err := parseDays(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func (v days) String() string {
	if v.d == nil {
		return "0s"
	}
	return formatDays(*v.d)
}

func (days) Type() string { return "duration" }

// Duration is the flag's value, for tests that compare it.
func (v days) Duration() time.Duration { return *v.d }

// leadingDays is an optional sign and a number of days, then the rest in
// Go's duration syntax.
var leadingDays = regexp.MustCompile(`^([-+]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)d(.*)$`)

// parseDays parses a Go duration ("90m", "1h30m") with an optional leading
// count of days ("7d", "1.5d", "1d12h").
func parseDays(s string) (time.Duration, error) {
	m := leadingDays.FindStringSubmatch(s)
	if m == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration: use e.g. 30s, 5m, 2h, 7d or 1d12h", s)
		}
		return d, nil
	}
	// Days as hours parse exactly (decimals included); times 24 is a day.
	h, err := time.ParseDuration(m[2] + "h")
	if err != nil || h > math.MaxInt64/24 {
		return 0, fmt.Errorf("%q is out of range: use at most %d days", s, math.MaxInt64/int64(24*time.Hour))
	}
	d := 24 * h
	if rest := m[3]; rest != "" {
		if strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
			return 0, fmt.Errorf("%q is not a duration: put the sign in front, e.g. -1d12h", s)
		}
		r, err := time.ParseDuration(rest)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration: use e.g. 30s, 5m, 2h, 7d or 1d12h", s)
		}
		if d > math.MaxInt64-r {
			return 0, fmt.Errorf("%q is out of range: use at most %d days", s, math.MaxInt64/int64(24*time.Hour))
		}
		d += r
	}
	if m[1] == "-" {
		d = -d
	}
	return d, nil
}

// formatDays writes d the way parseDays reads it, in days when it is at
// least one, without Go's trailing zero units: 168h is "7d", 36h "1d12h",
// 5m "5m".
func formatDays(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d < 0:
		if d == math.MinInt64 {
			return d.String()
		}
		return "-" + formatDays(-d)
	}
	const day = 24 * time.Hour
	var b strings.Builder
	if d >= day {
		fmt.Fprintf(&b, "%dd", d/day)
		d %= day
		if d == 0 {
			return b.String()
		}
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	b.WriteString(s)
	return b.String()
}
