package cli

import (
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// One name per meaning, across commands: a count of rows handled per
// statement or transaction is --batch-size (--cleanup-batch-size for the
// relay's cleanup job, beside --cleanup-pause), machine-readable output is
// --json. A name that was used before the convention stays as a hidden,
// deprecated alias of the same variable, so scripts keep working and are
// told the new name.

// deprecatedAlias registers old as a deprecated alias of the flag name,
// already registered on f: the same Value, so either name sets the same
// variable.
func deprecatedAlias(f *pflag.FlagSet, name, old string) {
	nf := f.Lookup(name)
	if nf == nil {
		panic("cli: alias --" + old + " of unknown flag --" + name)
	}
	f.AddFlag(&pflag.Flag{Name: old, Usage: "deprecated: use --" + name, Value: nf.Value, DefValue: nf.DefValue})
	_ = f.MarkDeprecated(old, "use --"+name)
}

// flagAsGiven is how the user spelled the flag name (or its alias old) on
// the command line, for an error about its value: "--batch 0" when they
// wrote --batch.
func flagAsGiven(f *pflag.FlagSet, name, old string) string {
	if o := f.Lookup(old); o != nil && o.Changed {
		return "--" + old
	}
	return "--" + name
}

// warnOnStderr sends pflag's warnings ("Flag --batch has been deprecated,
// use --batch-size") of every command to stderr. Cobra collects them and
// prints them on the command's out writer, stdout, where they would land
// in the middle of --json output.
func warnOnStderr(c *cobra.Command, stderr io.Writer) {
	c.Flags().SetOutput(stderr)
	c.PersistentFlags().SetOutput(stderr)
	for _, sub := range c.Commands() {
		warnOnStderr(sub, stderr)
	}
}

// suggestFlag adds to pflag's "unknown flag: --retenton" the nearest flags
// of c, as cobra does for a mistyped subcommand (it has nothing for
// flags): those within two edits of the name given, or that it starts
// with. Hidden and deprecated flags are not suggested.
func suggestFlag(c *cobra.Command, err error) string {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "unknown flag: --")
	if !ok {
		return msg
	}
	name, _, _ = strings.Cut(name, "=")
	best, picks := 3, []string(nil)
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Deprecated != "" {
			return
		}
		d := editDistance(name, f.Name)
		if d > 2 && strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = 2
		}
		switch {
		case d < best:
			best, picks = d, []string{"--" + f.Name}
		case d == best:
			picks = append(picks, "--"+f.Name)
		}
	})
	if len(picks) == 0 {
		return msg
	}
	return msg + "; did you mean " + strings.Join(picks, " or ") + "?"
}

// editDistance is the Levenshtein distance between a and b, in bytes
// (flag names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
