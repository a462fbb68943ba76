package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"testing/fstest"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/outbox/contracts"
)

// usageError ends a command with exit status 2: the command could not
// check anything (bad flags, a directory or revision that cannot be read).
func usageError(format string, args ...any) error {
	return &exitError{code: 2, msg: fmt.Sprintf(format, args...)}
}

func newContractsCheckCmd(g *globals) *cobra.Command {
	var o contractsCheck
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check that each event type's contract versions keep its compatibility mode; exit 1 when one breaks it (for CI)",
		Long: `check compares the versions of every event type in --contracts under the
type's compatibility mode (contract.json or contracts.json;
FORWARD_TRANSITIVE by default): each version against the one before it, or against every earlier
one for the _TRANSITIVE modes; NONE checks nothing. BACKWARD: a consumer
using the new version reads the events of the old one; FORWARD: a consumer
using the old version reads the events of the new one; FULL: both.

With --against DIR or --against-git REV (the contracts directory as it was
at a git revision, e.g. origin/main) it also compares with that earlier
copy: a published version is immutable, so a version in both that changed
(other than in white space or key order, its $ref'd files included) is an
error, as is removing a type's latest version, or a type when
contracts.json requires contracts; removing an older version or a type is a
warning, and so is a changed mode.

It prints one line per finding and a summary, and exits 0 when nothing
breaks, 1 when something does, 2 when it could not check (bad flags, a
directory or revision it cannot read). --json prints the same as one JSON
document (docs/contracts.md describes it).`,
		Example: `  outbox contracts check --contracts contracts
  outbox contracts check --contracts contracts --against-git origin/main
  outbox contracts check --contracts contracts --against ../last-release/contracts --json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError("contracts check takes no arguments (got %q); name the directory with --contracts DIR", args[0])
			}
			return nil
		},
		RunE: func(c *cobra.Command, _ []string) error { return o.run(c, g) },
	}
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError("%s (see '%s --help')", suggestFlag(c, err), c.CommandPath())
	})
	f := cmd.Flags()
	o.dir.register(f, "the contracts to check")
	f.StringVar(&o.against, "against", "", "an earlier copy of the contracts directory to compare with (the last release's, say)")
	f.StringVar(&o.revGit, "against-git", "", "compare with the contracts directory as it was at this git revision (e.g. origin/main) of the repository that holds --contracts")
	f.BoolVar(&o.asJSON, "json", false, "print one JSON document for scripts (the exit status is the same)")
	return cmd
}

// contractsCheck is the flags of outbox contracts check.
type contractsCheck struct {
	dir             contractsFlag
	against, revGit string
	asJSON          bool
}

func (o *contractsCheck) run(c *cobra.Command, g *globals) error {
	if o.dir.dir == "" {
		return usageError("contracts check needs --contracts DIR, the directory of the event contracts")
	}
	if o.against != "" && o.revGit != "" {
		return usageError("--against and --against-git both given; compare with one earlier copy")
	}
	current, err := o.dir.load()
	if err != nil {
		return usageError("%v", err)
	}
	var earlier *contracts.Set
	var src *againstJSON
	switch {
	case o.against != "":
		if earlier, err = contracts.Load(o.against); err != nil {
			return usageError("--against: %v", err)
		}
		src = &againstJSON{Kind: "dir", Ref: o.against}
	case o.revGit != "":
		var commit string
		if earlier, commit, err = loadGitContracts(c.Context(), o.dir.dir, o.revGit); err != nil {
			return usageError("--against-git: %v", err)
		}
		src = &againstJSON{Kind: "git", Ref: o.revGit, Commit: commit}
	}
	rep := contracts.Compare(earlier, current)
	if o.asJSON {
		if err := writeJSON(g, checkJSON{
			Compatible: rep.Compatible(), Contracts: o.dir.dir, Against: src,
			Types: rep.Types, Versions: rep.Versions,
			Errors: rep.Errors(), Warnings: len(rep.Findings) - rep.Errors(), Findings: rep.Findings,
		}); err != nil {
			return err
		}
	} else {
		printCheck(g.stdout, rep, src)
	}
	if !rep.Compatible() {
		return &exitError{code: 1}
	}
	return nil
}

// checkJSON is what --json prints; docs/contracts.md describes it.
type checkJSON struct {
	Compatible bool                `json:"compatible"`
	Contracts  string              `json:"contracts"`
	Against    *againstJSON        `json:"against"`
	Types      int                 `json:"types"`
	Versions   int                 `json:"versions"`
	Errors     int                 `json:"errors"`
	Warnings   int                 `json:"warnings"`
	Findings   []contracts.Finding `json:"findings"`
}

type againstJSON struct {
	// Kind is "dir" or "git".
	Kind string `json:"kind"`
	// Ref is the directory or the revision as given.
	Ref string `json:"ref"`
	// Commit is the revision's commit id (git only).
	Commit string `json:"commit,omitempty"`
}

func printCheck(w io.Writer, rep *contracts.Report, src *againstJSON) {
	for _, f := range rep.Findings {
		fmt.Fprintln(w, findingLine(f))
	}
	errs := rep.Errors()
	warns := len(rep.Findings) - errs
	checked := fmt.Sprintf("%s of %s checked", nOf(rep.Versions, "version"), nOf(rep.Types, "type"))
	if src != nil {
		checked += " against " + src.Ref
		if src.Commit != "" {
			checked += " (" + shortCommit(src.Commit) + ")"
		}
	}
	var summary string
	if errs == 0 {
		summary = "compatible: " + checked
	} else {
		summary = fmt.Sprintf("%s: %s", nOf(errs, "breaking change"), checked)
	}
	if warns > 0 {
		summary += fmt.Sprintf(", %s", nOf(warns, "warning"))
	}
	fmt.Fprintln(w, summary)
}

func shortCommit(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

// nOf is "1 version", "3 versions".
func nOf(n int, what string) string {
	return strconv.Itoa(n) + " " + plural(n, what, what+"s")
}

// findingLine is one finding on one line:
//
//	order.placed v2 -> v3 (BACKWARD): /properties/total: type narrowed from number to integer [type_narrowed]
func findingLine(f contracts.Finding) string {
	var b strings.Builder
	if f.Severity == contracts.SeverityWarning {
		b.WriteString("warning: ")
	}
	b.WriteString(f.Type)
	switch {
	case f.Direction != "":
		mode := string(f.Mode)
		if f.Mode.Backward() && f.Mode.Forward() {
			mode += ", " + string(f.Direction)
		}
		fmt.Fprintf(&b, " v%d -> v%d (%s): ", f.From, f.To, mode)
		if f.Pointer == "" {
			b.WriteString("(root): ")
		} else {
			b.WriteString(f.Pointer + ": ")
		}
	case f.From != 0:
		fmt.Fprintf(&b, " v%d: ", f.From)
	default:
		b.WriteString(": ")
	}
	b.WriteString(f.Message)
	b.WriteString(" [" + f.Rule + "]")
	return oneLine(b.String())
}

// loadGitContracts loads the contracts directory dir as it was at
// revision rev of the git repository that holds it, and returns the
// commit rev names.
func loadGitContracts(ctx context.Context, dir, rev string) (*contracts.Set, string, error) {
	if strings.HasPrefix(rev, "-") {
		return nil, "", fmt.Errorf("revision %q: a revision does not start with '-'", rev)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, "", fmt.Errorf("%s is not a directory", dir)
	}
	prefix, err := git(ctx, dir, nil, "rev-parse", "--show-prefix")
	if err != nil {
		return nil, "", fmt.Errorf("%s is not in a git work tree (%v); use --against DIR to compare with a copy on disk", dir, err)
	}
	prefix = strings.TrimSpace(prefix)
	commit, err := git(ctx, dir, nil, "rev-parse", "--verify", "--quiet", rev+"^{commit}")
	if err != nil {
		return nil, "", fmt.Errorf("unknown revision %q in the repository of %s (fetch it first, e.g. 'git fetch origin main')", rev, dir)
	}
	commit = strings.TrimSpace(commit)
	args := []string{"ls-tree", "-r", "-z", "--full-tree", commit}
	if prefix != "" {
		args = append(args, "--", prefix)
	}
	list, err := git(ctx, dir, nil, args...)
	if err != nil {
		return nil, "", err
	}
	type entry struct{ oid, path string }
	var files []entry
	for _, rec := range strings.Split(list, "\x00") {
		meta, p, ok := strings.Cut(rec, "\t")
		if !ok {
			continue
		}
		// "<mode> <type> <object>": blobs only, no symbolic links.
		fields := strings.Fields(meta)
		if len(fields) != 3 || fields[1] != "blob" || fields[0] == "120000" {
			continue
		}
		rel, ok := strings.CutPrefix(p, prefix)
		if !ok || !strings.HasSuffix(rel, ".json") {
			continue
		}
		files = append(files, entry{oid: fields[2], path: rel})
	}
	fsys := fstest.MapFS{}
	if len(files) > 0 {
		var in bytes.Buffer
		for _, f := range files {
			in.WriteString(f.oid + "\n")
		}
		out, err := git(ctx, dir, &in, "cat-file", "--batch")
		if err != nil {
			return nil, "", err
		}
		r := bufio.NewReader(strings.NewReader(out))
		for _, f := range files {
			header, err := r.ReadString('\n')
			if err != nil {
				return nil, "", fmt.Errorf("git cat-file: %v", err)
			}
			hf := strings.Fields(header)
			if len(hf) != 3 {
				return nil, "", fmt.Errorf("git cat-file: unexpected %q", header)
			}
			n, err := strconv.Atoi(hf[2])
			if err != nil {
				return nil, "", fmt.Errorf("git cat-file: unexpected %q", header)
			}
			data := make([]byte, n+1) // the content and its newline
			if _, err := io.ReadFull(r, data); err != nil {
				return nil, "", fmt.Errorf("git cat-file: %v", err)
			}
			fsys[path.Clean(f.path)] = &fstest.MapFile{Data: data[:n], Mode: 0o644}
		}
	}
	set, err := contracts.LoadFS(fsys)
	if err != nil {
		return nil, "", fmt.Errorf("the contracts at %s (%s): %w", rev, shortCommit(commit), err)
	}
	return set, commit, nil
}

// git runs git in dir and returns its standard output; its error carries
// git's own message.
func git(ctx context.Context, dir string, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
	cmd.Stdin = stdin
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			msg := strings.TrimSpace(errOut.String())
			if msg == "" {
				msg = err.Error()
			}
			return "", fmt.Errorf("git %s: %s", args[0], msg)
		}
		return "", fmt.Errorf("running git: %w (is git installed?)", err)
	}
	return out.String(), nil
}
