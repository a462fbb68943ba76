package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// `outbox relay --config FILE` reads its settings from a YAML file
// (docs/configuration.md). Its keys are the flags of `outbox relay`, by
// their names: the file's top level holds the defaults of every outbox,
// and each entry of its outboxes list one outbox's own settings. No key
// is listed here by hand but the few below that are not an outbox's
// setting: a flag added to `outbox relay` is a key of the file at once.
//
// The parser is go.yaml.in/yaml/v3, the maintained continuation of
// gopkg.in/yaml.v3 (already in the module graph through testify): its
// node tree keeps every key's and value's line and column, which the
// errors quote, and nothing else is needed of it.

// keyScope is where a flag of `outbox relay` may be set in a config file.
type keyScope int

const (
	// scopeOutbox: at the top level (every outbox's default) or in an
	// outboxes entry. Every flag not in fileKeyScopes.
	scopeOutbox keyScope = iota
	// scopeProcess: at the top level only, one value for the process.
	scopeProcess
	// scopeNone: not a key; the reason says why and what to do.
	scopeNone
)

// fileKeyScopes are the flags of `outbox relay` that are not an outbox's
// setting, with the reason; every other flag is one.
var fileKeyScopes = map[string]struct {
	scope keyScope
	why   string
}{
	"http":       {scopeProcess, "one server serves the metrics and health of every outbox"},
	"cpuprofile": {scopeProcess, "it profiles the whole process"},
	"log-level":  {scopeProcess, "the process has one log"},
	"log-format": {scopeProcess, "the process has one log"},
	"procs":      {scopeProcess, "the process has one GOMAXPROCS: with auto it follows the busiest outbox"},
	"config":     {scopeNone, "it names the file itself"},
	"check":      {scopeNone, "it is an action: run 'outbox relay --config FILE --check'"},
	"setup-only": {scopeNone, "it is an action on one outbox: run 'outbox relay --mode wal --setup-only' with that outbox's flags, or 'outbox switch to-wal'"},
	"teardown":   {scopeNone, "it is an action on one outbox: run 'outbox relay --mode wal --teardown' with that outbox's flags"},
	"help":       {scopeNone, "it is not a setting"},
}

// The keys of the file that are no flag.
const (
	keyOutboxes = "outboxes" // top level: the list of outboxes
	keyName     = "name"     // an outbox's name in logs, metrics and health
)

// fileValue is one key: value of the file.
type fileValue struct {
	key              string
	keyLine, keyCol  int
	line, col        int
	value            string   // with environment references expanded
	raw              string   // as written
	refs             []string // the environment variables it references
	fromCommandLine  bool     // set by a flag on the command line, not by the file
	flagType         string   // the flag's pflag type; "" for name
	secretNotDisplay bool     // never printed (sasl-password)
}

// fileEntry is one entry of the outboxes list.
type fileEntry struct {
	line, col int
	values    []fileValue
}

// relayFile is a config file, read and checked against the flags.
type relayFile struct {
	path string
	top  []fileValue
	// entries are the outboxes list's; nil when the file has none, and
	// its top level is then the one outbox.
	entries []fileEntry
	// env is the value of every environment variable the file
	// references, by name: none is ever printed or logged (scrubber).
	env map[string]string
}

// fileKeys tells the reader of a config file about the flags of `outbox
// relay`: lookup finds a flag by name (nil when there is none), and
// check sets a value on a scratch copy of the flags, so that a value the
// flag refuses is refused with its position.
type fileKeys struct {
	lookup func(name string) *pflag.Flag
	check  func(name, value string) error
	names  func() []string
}

// atPos formats an error at a position of the file.
func (f *relayFile) atPos(line, col int, format string, args ...any) error {
	return fmt.Errorf("%s:%d:%d: %s", f.path, line, col, fmt.Sprintf(format, args...))
}

// readRelayFile reads and checks the config file at path. getenv looks
// up the environment variables it references.
func readRelayFile(path string, keys fileKeys, getenv func(string) (string, bool)) (*relayFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	f := &relayFile{path: path, env: map[string]string{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: the file is empty; write the settings of the outboxes to relay (docs/configuration.md)", path)
		}
		return nil, fmt.Errorf("%s: %s; fix the YAML syntax there", path, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: the file holds more than one YAML document (a --- line); keep one", path)
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, f.atPos(root.Line, root.Column, "the file must be a mapping of keys to values, e.g. brokers: localhost:9092")
	}
	var list *yaml.Node
	f.top, list, err = f.mapping(root, keys, getenv, true)
	if err != nil {
		return nil, err
	}
	if list == nil {
		return f, nil
	}
	if i := slices.IndexFunc(f.top, func(v fileValue) bool { return v.key == keyName }); i >= 0 {
		v := f.top[i]
		return nil, f.atPos(v.keyLine, v.keyCol, "name names one outbox: move it into its entry of the outboxes list")
	}
	if list.Kind != yaml.SequenceNode || len(list.Content) == 0 {
		return nil, f.atPos(list.Line, list.Column, "outboxes must be a list of outboxes, each a mapping (- database-url: ...); remove the key to relay the one outbox of the top level")
	}
	for _, n := range list.Content {
		n = resolveAlias(n)
		if n.Kind != yaml.MappingNode {
			return nil, f.atPos(n.Line, n.Column, "each entry of outboxes must be a mapping of keys to values, e.g. - table: orders_outbox")
		}
		values, _, err := f.mapping(n, keys, getenv, false)
		if err != nil {
			return nil, err
		}
		f.entries = append(f.entries, fileEntry{line: n.Line, col: n.Column, values: values})
	}
	return f, nil
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// mapping reads the keys of m: the top level (top) or an outboxes entry.
// It returns the outboxes list's node, when top has one.
func (f *relayFile) mapping(m *yaml.Node, keys fileKeys, getenv func(string) (string, bool), top bool) ([]fileValue, *yaml.Node, error) {
	var out []fileValue
	var list *yaml.Node
	seen := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], resolveAlias(m.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return nil, nil, f.atPos(k.Line, k.Column, "a key must be a plain name, e.g. batch-size")
		}
		if line, dup := seen[k.Value]; dup {
			return nil, nil, f.atPos(k.Line, k.Column, "%s is given twice in this mapping (first on line %d); keep one", k.Value, line)
		}
		seen[k.Value] = k.Line
		if k.Value == keyOutboxes {
			if !top {
				return nil, nil, f.atPos(k.Line, k.Column, "outboxes goes at the top level of the file, not inside an outbox")
			}
			list = v
			continue
		}
		fv, err := f.value(k, v, keys, getenv, top)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, fv)
	}
	return out, list, nil
}

// value reads one key: value pair.
func (f *relayFile) value(k, v *yaml.Node, keys fileKeys, getenv func(string) (string, bool), top bool) (fileValue, error) {
	name := k.Value
	fv := fileValue{key: name, keyLine: k.Line, keyCol: k.Column, line: v.Line, col: v.Column}
	var flag *pflag.Flag
	if name != keyName {
		flag = keys.lookup(name)
		if err := f.keyAllowed(k, flag, keys, top); err != nil {
			return fv, err
		}
		fv.flagType = flag.Value.Type()
		fv.secretNotDisplay = secretKeys[name]
	}
	if v.Kind != yaml.ScalarNode {
		return fv, f.atPos(v.Line, v.Column, "%s takes one value (%s), not a list or a mapping", name, typeWords(fv.flagType))
	}
	if v.Tag == "!!null" {
		return fv, f.atPos(v.Line, v.Column, "%s has no value; give one (%s), or remove the key for the default", name, typeWords(fv.flagType))
	}
	fv.raw = v.Value
	value, refs, err := expandEnv(v.Value, getenv)
	if err != nil {
		return fv, f.atPos(v.Line, v.Column, "%s: %v", name, err)
	}
	fv.value, fv.refs = value, refs
	for _, r := range refs {
		f.env[r], _ = getenv(r)
	}
	if flag != nil {
		if err := keys.check(name, value); err != nil {
			return fv, f.atPos(v.Line, v.Column, "%s: %s", name, valueError(fv, err))
		}
	} else if err := checkOutboxName(value); err != nil {
		return fv, f.atPos(v.Line, v.Column, "name %q: %v", fv.display(), err)
	}
	return fv, nil
}

// keyAllowed refuses a key that is no flag, or not one for where it is.
func (f *relayFile) keyAllowed(k *yaml.Node, flag *pflag.Flag, keys fileKeys, top bool) error {
	name := k.Value
	if flag == nil {
		return f.atPos(k.Line, k.Column, "unknown key %s%s", name, suggestKey(name, keys.names()))
	}
	if flag.Deprecated != "" {
		return f.atPos(k.Line, k.Column, "%s is deprecated: %s", name, strings.ReplaceAll(flag.Deprecated, "--", ""))
	}
	s := fileKeyScopes[name]
	switch {
	case s.scope == scopeNone:
		return f.atPos(k.Line, k.Column, "%s is not a key of the file: %s", name, s.why)
	case s.scope == scopeProcess && !top:
		return f.atPos(k.Line, k.Column, "%s applies to the whole process (%s): set it at the top level of the file, not in an outbox", name, s.why)
	}
	return nil
}

// suggestKey is "; did you mean X?" for the keys nearest name, or "".
func suggestKey(name string, names []string) string {
	if kebab := strings.ReplaceAll(name, "_", "-"); kebab != name && slices.Contains(names, kebab) {
		return "; write " + kebab + " (the keys are the flags' names)"
	}
	best, picks := 3, []string(nil)
	for _, n := range names {
		d := editDistance(name, n)
		switch {
		case d < best:
			best, picks = d, []string{n}
		case d == best:
			picks = append(picks, n)
		}
	}
	if len(picks) == 0 {
		return "; the keys are the flags of 'outbox relay' without their dashes, plus name and outboxes (docs/configuration.md)"
	}
	return "; did you mean " + strings.Join(picks, " or ") + "?"
}

// typeWords says what a flag of type t takes, for an error.
func typeWords(t string) string {
	switch t {
	case "int", "int64", "int32":
		return "a whole number"
	case "bool":
		return "true or false"
	case "duration":
		return "a duration such as 500ms, 30s, 5m or 7d"
	}
	return "a string"
}

// valueError says why a flag refused v, in the file's words, without
// quoting v's expansion of an environment variable.
func valueError(v fileValue, err error) string {
	switch v.flagType {
	case "int", "int64", "int32", "bool":
		return fmt.Sprintf("%q is not %s", v.display(), typeWords(v.flagType))
	}
	msg := err.Error()
	// pflag's own words name the flag: the file's name the key already.
	if rest, ok := strings.CutPrefix(msg, "invalid argument "); ok {
		if _, after, found := strings.Cut(rest, " flag: "); found {
			msg = after
		}
	}
	if v.value != v.raw {
		msg = strings.ReplaceAll(msg, v.value, v.raw)
	}
	return msg
}

// secretKeys are the keys whose value is never printed, even in part.
var secretKeys = map[string]bool{"sasl-password": true}

// urlKeys are the keys whose value is a URL or a connection string,
// printed with its password hidden.
var urlKeys = map[string]bool{"database-url": true, "sink": true}

// display is the value as --check prints it: environment references as
// written (never their values), a password of a URL or connection string
// hidden, a secret key's value hidden unless it is a reference.
func (v fileValue) display() string {
	s := v.raw
	if v.fromCommandLine {
		s = v.value
	}
	switch {
	case v.secretNotDisplay && !isOneReference(s) && s != "":
		return "***"
	case urlKeys[v.key]:
		return redactConnString(s)
	}
	return s
}

// redactConnString hides the password of a URL or of a key=value
// connection string, unless it is an environment reference (${NAME}),
// which says where the password comes from and holds none.
func redactConnString(s string) string {
	var refs []string
	s = anyRef.ReplaceAllStringFunc(s, func(ref string) string {
		refs = append(refs, ref)
		return fmt.Sprintf("outboxref%dref", len(refs)-1)
	})
	isRef := func(v string) bool { return placeholder.MatchString(v) }
	if strings.Contains(s, "://") {
		if u, err := url.Parse(s); err == nil {
			if pw, ok := u.User.Password(); ok && !isRef(pw) {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			}
			s = u.String()
		} else {
			s = redactURL(s)
		}
	} else {
		s = keywordPassword.ReplaceAllStringFunc(s, func(kv string) string {
			m := keywordPassword.FindStringSubmatch(kv)
			if isRef(m[2]) {
				return kv
			}
			return m[1] + "***"
		})
	}
	return placeholderAny.ReplaceAllStringFunc(s, func(p string) string {
		i, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(p, "outboxref"), "ref"))
		return refs[i]
	})
}

var (
	keywordPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&)]*)`)
	anyRef          = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*\}`)
	placeholder     = regexp.MustCompile(`^outboxref[0-9]+ref$`)
	placeholderAny  = regexp.MustCompile(`outboxref[0-9]+ref`)
)

var envRef = regexp.MustCompile(`^\$\{[A-Za-z_][A-Za-z0-9_]*\}$`)

func isOneReference(s string) bool { return envRef.MatchString(s) }

// expandEnv replaces each ${NAME} of s by the environment variable NAME;
// $${ stands for a literal ${. A $ followed by anything else is itself.
func expandEnv(s string, getenv func(string) (string, bool)) (string, []string, error) {
	var b strings.Builder
	var refs []string
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), refs, nil
		}
		if i > 0 && s[i-1] == '$' {
			b.WriteString(s[:i-1] + "${")
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", nil, errors.New("${ without its closing }: write ${NAME} to use the environment variable NAME, or $${ for a literal ${")
		}
		name := s[i+2 : i+end]
		if !envRef.MatchString("${" + name + "}") {
			return "", nil, fmt.Errorf("${%s} is not an environment variable's name: use letters, digits and _ (write $${ for a literal ${)", name)
		}
		v, ok := getenv(name)
		if !ok {
			return "", nil, fmt.Errorf("environment variable %s is not set; export it (or remove ${%s} from the file)", name, name)
		}
		b.WriteString(v)
		if !slices.Contains(refs, name) {
			refs = append(refs, name)
		}
		s = s[i+end+1:]
	}
}

// outboxNameRE is what an outbox's name may hold: it is a Prometheus
// label value and a log value, and stays readable in both.
var outboxNameRE = regexp.MustCompile(`^[A-Za-z0-9_.@:/+-]{1,120}$`)

func checkOutboxName(name string) error {
	if !outboxNameRE.MatchString(name) {
		return errors.New("use 1 to 120 letters, digits and _ . @ : / + -")
	}
	return nil
}

// scrubber replaces the values of the environment variables a config
// file referenced by their references, in anything printed or logged:
// a secret read from the environment never leaves the process, even in
// an error that quotes a connection string. Values under 4 bytes are
// left alone: they are no secret worth the noise of hiding every "1".
type scrubber struct{ r *strings.Replacer }

func newScrubber(env map[string]string) scrubber {
	type pair struct{ from, to string }
	var pairs []pair
	for n, v := range env {
		if len(v) < 4 {
			continue
		}
		// As written, and escaped as the JSON and text log formats and
		// %q write it.
		forms := []string{v, strings.Trim(strconv.Quote(v), `"`)}
		if j, err := json.Marshal(v); err == nil {
			forms = append(forms, strings.Trim(string(j), `"`))
		}
		for _, f := range forms {
			if !slices.ContainsFunc(pairs, func(p pair) bool { return p.from == f }) {
				pairs = append(pairs, pair{f, "${" + n + "}"})
			}
		}
	}
	if len(pairs) == 0 {
		return scrubber{}
	}
	// Longest first, so that a value holding another is replaced whole.
	slices.SortFunc(pairs, func(a, b pair) int { return len(b.from) - len(a.from) })
	var args []string
	for _, p := range pairs {
		args = append(args, p.from, p.to)
	}
	return scrubber{strings.NewReplacer(args...)}
}

func (s scrubber) String(v string) string {
	if s.r == nil {
		return v
	}
	return s.r.Replace(v)
}

// Error is err with every secret replaced, or err itself when it holds
// none.
func (s scrubber) Error(err error) error {
	if err == nil || s.r == nil {
		return err
	}
	if msg := s.r.Replace(err.Error()); msg != err.Error() {
		return errors.New(msg)
	}
	return err
}

// Writer is w with every secret replaced in each write: the logs go
// through it (a log handler writes one record per Write).
func (s scrubber) Writer(w io.Writer) io.Writer {
	if s.r == nil {
		return w
	}
	return scrubWriter{w, s.r}
}

type scrubWriter struct {
	w io.Writer
	r *strings.Replacer
}

func (sw scrubWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(sw.w, sw.r.Replace(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
