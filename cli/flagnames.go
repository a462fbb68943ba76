package cli

import (
	"io"

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
