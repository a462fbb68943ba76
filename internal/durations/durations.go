// Package durations applies the defaults of a configuration's durations
// and refuses negative ones, with one error wording for every config of
// the operations packages: a config's WithDefaults calls Fill, its
// Validate calls Check, on the same list.
package durations

import (
	"fmt"
	"time"
)

// Default is one duration of a config: its field name for errors, where
// it is, and its default.
type Default struct {
	Name string
	V    *time.Duration
	Def  time.Duration
}

// Fill sets each zero duration to its default. A negative one stays, for
// Check to refuse.
func Fill(ds []Default) {
	for _, d := range ds {
		if *d.V == 0 {
			*d.V = d.Def
		}
	}
}

// Check refuses the first negative duration; what names the config in
// the error ("ops: monitor RefreshInterval is -1s; ...").
func Check(what string, ds []Default) error {
	for _, d := range ds {
		if *d.V < 0 {
			return fmt.Errorf("ops: %s %s is %s; use a positive duration, or 0 for the default %s", what, d.Name, *d.V, d.Def)
		}
	}
	return nil
}
