// Package docs_test checks the documentation against the code: every shell
// command in README.md and docs/ (sinks included) names a real `outbox` command and real
// flags, the quick ones run, and every relative link and #anchor resolves.
package docs_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
)

// root is the repository's root, seen from this package's directory.
const root = ".."

// notRun is the marker a block that cannot run here carries on the line
// just before its fence: <!-- not run: why -->.
var notRun = regexp.MustCompile(`^\s*<!--\s*not run:\s*(.+?)\s*-->\s*$`)

// shellLangs are the fences whose commands are checked.
var shellLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}

// page is one Markdown file of the documentation.
type page struct {
	path string // relative to root, slash-separated
	text string
}

// block is one fenced shell block of a page.
type block struct {
	page   string
	line   int    // of the opening fence, 1-based
	notRun string // the marker's reason; "" when the block must run
	cmds   []command
}

// command is one simple command of a block.
type command struct {
	line int
	env  []string // VAR=value prefixes
	args []string // words, the program first
}

func (c command) String() string { return strings.Join(c.args, " ") }

func (b block) where() string { return fmt.Sprintf("%s:%d", b.page, b.line) }

// pages reads README.md, BENCHMARKS.md, docs/*.md and docs/sinks/*.md.
func pages(t *testing.T) []page {
	t.Helper()
	names := []string{"README.md", "BENCHMARKS.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	sinks, err := filepath.Glob(filepath.Join(root, "docs", "sinks", "*.md"))
	docs = append(docs, sinks...)
	require.NoError(t, err)
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		require.NoError(t, err)
		names = append(names, filepath.ToSlash(rel))
	}
	var out []page
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(n)))
		require.NoError(t, err)
		out = append(out, page{path: n, text: string(b)})
	}
	return out
}

var fence = regexp.MustCompile("^(\\s*)(```+|~~~+)\\s*([A-Za-z0-9_-]*)")

// blocks returns the page's fenced shell blocks, with their commands.
func blocks(p page) ([]block, []string) {
	var out []block
	var problems []string
	lines := strings.Split(p.text, "\n")
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		marker, lang, start := m[2], m[3], i
		var body []string
		for i++; i < len(lines); i++ {
			if strings.HasPrefix(strings.TrimSpace(lines[i]), marker) {
				break
			}
			body = append(body, strings.TrimPrefix(lines[i], m[1]))
		}
		if !shellLangs[lang] {
			continue
		}
		b := block{page: p.path, line: start + 1}
		for j := start - 1; j >= 0; j-- {
			if strings.TrimSpace(lines[j]) == "" {
				continue
			}
			if mm := notRun.FindStringSubmatch(lines[j]); mm != nil {
				b.notRun = mm[1]
			}
			break
		}
		cmds, err := parseShell(body, start+2, lang == "console")
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", b.where(), err))
		}
		b.cmds = cmds
		out = append(out, b)
	}
	return out, problems
}

// parseShell splits a block's lines into simple commands: continuation
// lines joined, comments dropped, `&&`, `;`, `|`, `&` and parentheses
// separating commands, redirections dropped. A console block's commands
// are its lines that start with "$ ".
func parseShell(lines []string, first int, console bool) ([]command, error) {
	var out []command
	for i := 0; i < len(lines); i++ {
		line, at := lines[i], first+i
		if console {
			if !strings.HasPrefix(line, "$ ") {
				continue
			}
			line = line[2:]
		}
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + lines[i]
		}
		words, err := splitWords(line)
		if err != nil {
			return out, fmt.Errorf("line %d: %w", at, err)
		}
		var cur command
		flush := func() {
			if len(cur.args) > 0 || len(cur.env) > 0 {
				cur.line = at
				out = append(out, cur)
			}
			cur = command{}
		}
		for k := 0; k < len(words); k++ {
			w := words[k]
			switch {
			case w.op && (w.s == "&&" || w.s == "||" || w.s == ";" || w.s == "|" || w.s == "&" || w.s == "(" || w.s == ")"):
				flush()
			case w.op && (w.s == ">" || w.s == "<" || w.s == ">>" || w.s == "2>"):
				k++ // and its target
			case len(cur.args) == 0 && !w.quoted && assignment.MatchString(w.s):
				cur.env = append(cur.env, w.s)
			default:
				cur.args = append(cur.args, w.s)
			}
		}
		flush()
	}
	return out, nil
}

// assignment is a VAR=value word before a command's name.
var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

type word struct {
	s      string
	op     bool // a shell operator, not a word
	quoted bool // had quotes
}

// splitWords splits a line as a POSIX shell would, for the subset the docs
// use: single and double quotes, backslash escapes, # comments, and the
// operators listed in parseShell.
func splitWords(line string) ([]word, error) {
	var out []word
	var cur strings.Builder
	in, quoted := false, false
	emit := func() {
		if in {
			out = append(out, word{s: cur.String(), quoted: quoted})
		}
		cur.Reset()
		in, quoted = false, false
	}
	r := []rune(line)
	for i := 0; i < len(r); i++ {
		c := r[i]
		switch {
		case c == '\'':
			j := slices.Index(r[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated single quote")
			}
			cur.WriteString(string(r[i+1 : i+1+j]))
			in, quoted = true, true
			i += j + 1
		case c == '"':
			in, quoted = true, true
			for i++; ; i++ {
				if i >= len(r) {
					return nil, fmt.Errorf("unterminated double quote")
				}
				if r[i] == '"' {
					break
				}
				if r[i] == '\\' && i+1 < len(r) && strings.ContainsRune("\"\\$`", r[i+1]) {
					i++
				}
				cur.WriteRune(r[i])
			}
		case c == '\\' && i+1 < len(r):
			i++
			cur.WriteRune(r[i])
			in = true
		case c == '#' && !in:
			emit()
			return out, nil
		case unicode.IsSpace(c):
			emit()
		case strings.ContainsRune("&|;()<>", c):
			emit()
			op := string(c)
			if i+1 < len(r) && (c == '&' || c == '|' || c == '>') && r[i+1] == c {
				op += string(c)
				i++
			}
			out = append(out, word{s: op, op: true})
		default:
			if c == '2' && !in && i+1 < len(r) && r[i+1] == '>' {
				out = append(out, word{s: "2>", op: true})
				i++
				continue
			}
			cur.WriteRune(c)
			in = true
		}
	}
	emit()
	return out, nil
}

// outboxArgs returns the arguments of the `outbox` command that c runs, and
// whether it runs one: `outbox ...`, `bin/outbox ...` or
// `go run ./cmd/outbox ...`.
func outboxArgs(c command) ([]string, bool) {
	a := c.args
	switch {
	case len(a) > 0 && (a[0] == "outbox" || a[0] == "bin/outbox" || a[0] == "./bin/outbox"):
		return a[1:], true
	case len(a) >= 3 && a[0] == "go" && a[1] == "run" && (a[2] == "./cmd/outbox" || a[2] == "github.com/pgoutbox/outbox/cmd/outbox"):
		return a[3:], true
	}
	return nil, false
}

// usagePath reads the command path from a help text's "Usage:" section:
// "outbox events show [flags]" is [events show].
var usageLine = regexp.MustCompile(`(?m)^Usage:\n\s+outbox((?: [a-z][a-z0-9-]*)*)`)

// checker checks commands against the built binary, caching help runs.
type checker struct {
	bin      string
	makefile string
	mu       sync.Mutex
	help     map[string]helpResult
}

type helpResult struct {
	out string
	err error
}

func (ck *checker) helpFor(args []string) helpResult {
	key := strings.Join(args, "\x00")
	ck.mu.Lock()
	r, ok := ck.help[key]
	ck.mu.Unlock()
	if ok {
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, ck.bin, append(slices.Clone(args), "--help")...)
	cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true")
	out, err := cmd.CombinedOutput()
	r = helpResult{out: string(out), err: err}
	ck.mu.Lock()
	ck.help[key] = r
	ck.mu.Unlock()
	return r
}

// checkOutbox says what is wrong with an `outbox` command line: a command
// or flag that does not exist, a value a flag refuses.
func (ck *checker) checkOutbox(args []string) string {
	r := ck.helpFor(args)
	if r.err != nil {
		return fmt.Sprintf("`outbox %s --help` fails: %s", strings.Join(args, " "), strings.TrimSpace(r.out))
	}
	m := usageLine.FindStringSubmatch(r.out)
	if m == nil {
		return fmt.Sprintf("`outbox %s --help` prints no usage line", strings.Join(args, " "))
	}
	path := strings.Fields(m[1])
	var lead []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			break
		}
		lead = append(lead, a)
	}
	if len(lead) < len(path) || !slices.Equal(lead[:len(path)], path) {
		return fmt.Sprintf("`outbox %s` resolves to `outbox %s`", strings.Join(args, " "), strings.Join(path, " "))
	}
	if len(lead) > len(path) && strings.Contains(r.out, "\nAvailable Commands:") {
		return fmt.Sprintf("`outbox %s` has no subcommand %q", strings.Join(path, " "), lead[len(path)])
	}
	return ""
}

var makeTarget = regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`)

// check says what is wrong with a command, whether it is run or not:
// `outbox` commands and flags must exist, a make target must be in the
// Makefile, a local package given to `go run`/`go test`/`go build` must
// exist.
func (ck *checker) check(c command) string {
	if args, ok := outboxArgs(c); ok {
		return ck.checkOutbox(args)
	}
	if len(c.args) == 0 {
		return ""
	}
	switch c.args[0] {
	case "make":
		for _, tg := range c.args[1:] {
			if strings.HasPrefix(tg, "-") || strings.Contains(tg, "=") {
				continue
			}
			found := false
			for _, m := range makeTarget.FindAllStringSubmatch(ck.makefile, -1) {
				found = found || m[1] == tg
			}
			if !found {
				return fmt.Sprintf("the Makefile has no target %q", tg)
			}
		}
	case "go":
		for _, a := range c.args[1:] {
			if !strings.HasPrefix(a, "./") {
				continue
			}
			dir := strings.TrimSuffix(strings.TrimSuffix(a, "..."), "/")
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dir))); err != nil {
				return fmt.Sprintf("no package %s in the repository", a)
			}
		}
	}
	return ""
}

// shared is the one checker of the package's tests: the binary is built
// once, into a directory removed when the tests end (TestMain).
var shared = sync.OnceValues(func() (*checker, error) {
	dir, err := os.MkdirTemp("", "outbox-docs-")
	if err != nil {
		return nil, err
	}
	binDir = dir
	bin := filepath.Join(dir, "outbox")
	build := exec.Command("go", "build", "-o", bin, "./cmd/outbox")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/outbox: %v: %s", err, out)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		return nil, err
	}
	return &checker{bin: bin, makefile: string(mk), help: map[string]helpResult{}}, nil
})

var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func newChecker(t *testing.T) *checker {
	t.Helper()
	ck, err := shared()
	require.NoError(t, err)
	return ck
}

// Every shell block names real commands and flags; an unmarked block is
// run, command by command, against a database of its own, and must
// succeed; a block that cannot run here says why in a marker.
func TestShellBlocks(t *testing.T) {
	t.Parallel()
	ck := newChecker(t)
	for _, p := range pages(t) {
		bs, problems := blocks(p)
		for _, pr := range problems {
			t.Error(pr)
		}
		if len(bs) == 0 {
			continue
		}
		t.Run(p.path, func(t *testing.T) {
			t.Parallel()
			var run []block
			for _, b := range bs {
				for _, c := range b.cmds {
					if msg := ck.check(c); msg != "" {
						t.Errorf("%s:%d: %s", p.path, c.line, msg)
					}
				}
				if b.notRun != "" {
					continue
				}
				for _, c := range b.cmds {
					if _, ok := outboxArgs(c); !ok {
						t.Errorf("%s: `%s` cannot run here: add `<!-- not run: why -->` on the line before the fence", b.where(), c)
					}
				}
				run = append(run, b)
			}
			if len(run) == 0 || t.Failed() {
				return
			}
			runBlocks(t, ck, run)
		})
	}
}

// runBlocks runs the blocks' commands in order, in a database of their
// own with the outbox tables migrated.
func runBlocks(t *testing.T, ck *checker, bs []block) {
	ctx := context.Background()
	url, drop, err := pgtest.ScratchDatabase(ctx, "docs")
	require.NoError(t, err)
	t.Cleanup(drop)
	for _, b := range bs {
		for _, c := range b.cmds {
			args, _ := outboxArgs(c)
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			cmd := exec.CommandContext(cctx, ck.bin, args...)
			cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "OTEL_SDK_DISABLED=true")
			cmd.Env = append(cmd.Env, c.env...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			cancel()
			t.Logf("%s:%d: ran `%s`", b.page, c.line, c)
			if err != nil {
				t.Errorf("%s:%d: `%s` failed (%v):\n%s", b.page, c.line, c, err, out.String())
			}
		}
	}
}

// The checker catches what it is for: a command, subcommand or flag that
// does not exist, a make target that does not, and an unmarked block that
// cannot run here.
func TestCheckerCatchesMistakes(t *testing.T) {
	t.Parallel()
	ck := newChecker(t)
	doc := page{path: "bad.md", text: "```sh\noutbox stats --json\noutbox evnts show 1\noutbox events shwo 1\noutbox stats --no-such-flag\noutbox cleanup --retention 7x\nmake no-such-target\nkcat -C -t order\n```\n\n<!-- not run: a reason -->\n```sh\nkcat -C -t order\n```\n"}
	bs, problems := blocks(doc)
	require.Empty(t, problems)
	require.Len(t, bs, 2)
	require.Equal(t, "", bs[0].notRun)
	require.Equal(t, "a reason", bs[1].notRun)
	var got []string
	for _, c := range bs[0].cmds {
		got = append(got, ck.check(c))
	}
	require.Equal(t, "", got[0], "a real command and flag")
	require.Contains(t, got[1], `unknown command "evnts"`)
	require.Contains(t, got[2], `has no subcommand "shwo"`)
	require.Contains(t, got[3], "unknown flag: --no-such-flag")
	require.Contains(t, got[4], "7x")
	require.Contains(t, got[5], `no target "no-such-target"`)
	_, ok := outboxArgs(bs[0].cmds[6])
	require.False(t, ok, "kcat is not run, so its unmarked block fails")

	cmds, err := parseShell([]string{`FOO=1 outbox events park 42 --reason "two words" --yes  # a comment`, `outbox dev-kafka & (cd x && go run . --n 1) > out.txt`}, 1, false)
	require.NoError(t, err)
	require.Equal(t, [][]string{
		{"outbox", "events", "park", "42", "--reason", "two words", "--yes"},
		{"outbox", "dev-kafka"}, {"cd", "x"}, {"go", "run", ".", "--n", "1"},
	}, func() (a [][]string) {
		for _, c := range cmds {
			a = append(a, c.args)
		}
		return a
	}())
	require.Equal(t, []string{"FOO=1"}, cmds[0].env)
}

// slug is the anchor GitHub gives a heading: lower case, punctuation but
// '-' and '_' dropped, spaces as '-'.
func slug(heading string) string {
	heading = link.ReplaceAllStringFunc(heading, func(l string) string { return l[1:strings.Index(l, "](")] })
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var heading = regexp.MustCompile(`^(#{1,6})\s+(.+?)\s*#*\s*$`)

// anchors returns the page's heading anchors, numbered as GitHub numbers
// repeated ones (-1, -2, ...), outside fenced blocks.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := ""
	for _, line := range strings.Split(text, "\n") {
		if m := fence.FindStringSubmatch(line); m != nil {
			switch {
			case inFence == "":
				inFence = m[2]
				continue
			case strings.HasPrefix(strings.TrimSpace(line), inFence):
				inFence = ""
				continue
			}
		}
		if inFence != "" {
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			s := slug(m[2])
			if n := seen[s]; n > 0 {
				out[fmt.Sprintf("%s-%d", s, n)] = true
			} else {
				out[s] = true
			}
			seen[s]++
		}
	}
	return out
}

var (
	link       = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	inlineCode = regexp.MustCompile("`[^`]*`")
)

// links returns the page's Markdown link targets with their lines,
// outside fenced blocks and inline code.
func links(text string) (targets []string, lines []int) {
	inFence := ""
	for i, line := range strings.Split(text, "\n") {
		if m := fence.FindStringSubmatch(line); m != nil {
			switch {
			case inFence == "":
				inFence = m[2]
				continue
			case strings.HasPrefix(strings.TrimSpace(line), inFence):
				inFence = ""
				continue
			}
		}
		if inFence != "" {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			targets = append(targets, m[1])
			lines = append(lines, i+1)
		}
	}
	return targets, lines
}

// scheme starts a link that leaves the repository: http:, https:, mailto:.
var scheme = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`)

// resolve says what is wrong with a link target from a file at from
// (relative to root): a missing file, or an anchor no heading has.
func resolve(from, target string) string {
	if scheme.MatchString(target) {
		return "" // http:, https:, mailto:
	}
	path, anchor, _ := strings.Cut(target, "#")
	file := filepath.Join(root, filepath.FromSlash(from))
	if path != "" {
		file = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
	}
	if _, err := os.Stat(file); err != nil {
		return fmt.Sprintf("%s: no such file", target)
	}
	if anchor == "" {
		return ""
	}
	if !strings.HasSuffix(file, ".md") {
		return fmt.Sprintf("%s: an anchor into a file that is not Markdown", target)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	if !anchors(string(b))[anchor] {
		return fmt.Sprintf("%s: no heading has the anchor #%s", target, anchor)
	}
	return ""
}

// Every relative link and #anchor in the docs resolves.
func TestLinksResolve(t *testing.T) {
	t.Parallel()
	for _, p := range pages(t) {
		targets, lines := links(p.text)
		for i, tg := range targets {
			if msg := resolve(p.path, tg); msg != "" {
				t.Errorf("%s:%d: %s", p.path, lines[i], msg)
			}
		}
	}
}

// Every alert of deploy/prometheus/alerts.yml has a runbook section in
// docs/operations.md named after it, and its runbook annotation links
// there by the docs' absolute URL on GitHub.
func TestEveryAlertHasARunbookSection(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	require.NoError(t, err)
	ops, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	require.NoError(t, err)
	sections := anchors(string(ops))
	alert := regexp.MustCompile(`(?m)^\s*- alert: (\w+)\s*$`)
	runbook := regexp.MustCompile(`(?m)^\s*runbook: "?([^"\s]+)"?\s*$`)
	names := alert.FindAllStringSubmatchIndex(string(rules), -1)
	require.NotEmpty(t, names)
	for i, m := range names {
		name := string(rules)[m[2]:m[3]]
		end := len(rules)
		if i+1 < len(names) {
			end = names[i+1][0]
		}
		require.True(t, sections[strings.ToLower(name)], "docs/operations.md has no `### %s` section", name)
		rb := runbook.FindStringSubmatch(string(rules)[m[1]:end])
		if !assertf(t, rb != nil, "alert %s has no runbook annotation", name) {
			continue
		}
		// An absolute URL, so that it opens from an alert notification.
		const docs = "https://github.com/pgoutbox/outbox/blob/main/"
		if want := docs + "docs/operations.md#" + strings.ToLower(name); rb[1] != want {
			t.Errorf("alert %s: runbook %s, want %s", name, rb[1], want)
		}
		if msg := resolve("README.md", strings.TrimPrefix(rb[1], docs)); msg != "" { // relative to the root, as README.md's links are
			t.Errorf("alert %s: %s", name, msg)
		}
	}
}

func assertf(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}

// The README stays a page a newcomer reads in minutes.
func TestReadmeIsShort(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), 15000, "README.md is %d characters; move detail into a page of docs/", len(b))
}
