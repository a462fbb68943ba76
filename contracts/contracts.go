package contracts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Compatibility is the rule `outbox contracts check` enforces between the
// versions of one type, as the Confluent schema registry defines it.
type Compatibility string

// The compatibility modes. A check compares a new version with the one
// before it, or with every earlier one in the transitive forms.
const (
	// None: no check.
	None Compatibility = "NONE"
	// Backward: a consumer that reads with the new version accepts every
	// event written with the previous one. Upgrade consumers first.
	Backward Compatibility = "BACKWARD"
	// BackwardTransitive: Backward against every earlier version.
	BackwardTransitive Compatibility = "BACKWARD_TRANSITIVE"
	// Forward: a consumer that reads with the previous version accepts
	// every event written with the new one. Upgrade producers first.
	Forward Compatibility = "FORWARD"
	// ForwardTransitive: Forward against every earlier version.
	ForwardTransitive Compatibility = "FORWARD_TRANSITIVE"
	// Full: both Backward and Forward.
	Full Compatibility = "FULL"
	// FullTransitive: Full against every earlier version.
	FullTransitive Compatibility = "FULL_TRANSITIVE"
)

// DefaultCompatibility is the mode of a type that declares none:
// every consumer written against an earlier version reads the events of a
// new one. In an outbox the producer owns the event type and ships first,
// while consumers of every age keep reading the topic; events older than
// a consumer's version reach it through upcasters. (The Confluent
// registry defaults to BACKWARD, where consumers upgrade first.)
const DefaultCompatibility = ForwardTransitive

// Compatibilities lists every mode, for help texts and errors.
var Compatibilities = []Compatibility{None, Backward, BackwardTransitive, Forward, ForwardTransitive, Full, FullTransitive}

// Valid reports whether c is one of the modes.
func (c Compatibility) Valid() bool { return slices.Contains(Compatibilities, c) }

// Transitive reports whether c checks against every earlier version.
func (c Compatibility) Transitive() bool { return strings.HasSuffix(string(c), "_TRANSITIVE") }

// Backward reports whether c requires new versions to read old events.
func (c Compatibility) Backward() bool {
	return strings.HasPrefix(string(c), "BACKWARD") || strings.HasPrefix(string(c), "FULL")
}

// Forward reports whether c requires old versions to read new events.
func (c Compatibility) Forward() bool {
	return strings.HasPrefix(string(c), "FORWARD") || strings.HasPrefix(string(c), "FULL")
}

// Errors Check returns besides *Violation; test with errors.Is.
var (
	// ErrNoContract: the set requires a contract for every type, and the
	// event's type has none.
	ErrNoContract = errors.New("contracts: the event type has no contract")
	// ErrUnknownVersion: the event names a version its type's contract
	// does not have.
	ErrUnknownVersion = errors.New("contracts: the event's contract version is unknown")
)

// Set is a loaded contracts directory: every type's versions, compiled.
// It is safe for concurrent use and never changes after Load.
type Set struct {
	// Dir is the directory it was loaded from ("" for an fs.FS).
	Dir string
	// Require makes Check refuse a type without a contract.
	Require bool
	types   map[string]*Type
	// files are every JSON schema file of the directory, decoded, by
	// path: the compatibility checker follows $refs among them.
	files map[string]any
}

// Type is one event type's contract.
type Type struct {
	// Name is the event type, e.g. "order.placed".
	Name string
	// Compatibility is the mode its versions keep.
	Compatibility Compatibility
	// Versions are its versions, lowest first.
	Versions []*Version
}

// Latest is the type's highest version.
func (t *Type) Latest() *Version { return t.Versions[len(t.Versions)-1] }

// Version returns version n of the type, or nil.
func (t *Type) Version(n int) *Version {
	for _, v := range t.Versions {
		if v.Number == n {
			return v
		}
	}
	return nil
}

// Version is one version of a type's contract.
type Version struct {
	// Number is the version, from its file name (v2.schema.json: 2).
	Number int
	// Path is the file, relative to the directory ("order.placed/v2.schema.json").
	Path string
	// Raw is the schema file's bytes, as written.
	Raw []byte
	// Doc is the schema decoded as JSON (numbers as json.Number), for
	// tools that read it (the compatibility checker, AsyncAPI).
	Doc    any
	schema *jsonschema.Schema
}

// Types returns the set's types, sorted by name.
func (s *Set) Types() []*Type {
	out := make([]*Type, 0, len(s.types))
	for _, t := range s.types {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Type returns the contract of eventType, or nil when it has none.
func (s *Set) Type(eventType string) *Type {
	if s == nil {
		return nil
	}
	return s.types[eventType]
}

// settings is contracts.json and contract.json.
type settings struct {
	Compatibility Compatibility `json:"compatibility"`
	Require       *bool         `json:"require"`
}

// Load reads and compiles the contracts directory dir.
func Load(dir string) (*Set, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("contracts: %w; --contracts names the directory of the event contracts (one folder per event type, holding v1.schema.json, ...)", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("contracts: %s is not a directory; --contracts names the directory of the event contracts (one folder per event type)", dir)
	}
	s, err := LoadFS(os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, dir)
	}
	s.Dir = dir
	return s, nil
}

// baseURL roots the directory's files for the compiler: $refs resolve
// among them and nowhere else.
const baseURL = "file:///contracts/"

// LoadFS reads and compiles a contracts directory from fsys (its root is
// the directory). The compatibility checker loads an earlier revision
// this way.
func LoadFS(fsys fs.FS) (*Set, error) {
	s := &Set{types: map[string]*Type{}}
	var top settings
	if err := readSettings(fsys, "contracts.json", &top); err != nil {
		return nil, err
	}
	if top.Require != nil {
		s.Require = *top.Require
	}
	def := DefaultCompatibility
	if top.Compatibility != "" {
		def = top.Compatibility
	}

	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noRemote{})
	docs, err := addResources(fsys, c)
	if err != nil {
		return nil, err
	}

	s.files = docs
	for p, doc := range docs {
		dir, file := path.Split(p)
		n, ok := versionOf(file)
		if !ok || strings.Count(p, "/") != 1 || strings.HasPrefix(dir, "_") {
			continue
		}
		name := strings.TrimSuffix(dir, "/")
		t := s.types[name]
		if t == nil {
			t = &Type{Name: name, Compatibility: def}
			var ts settings
			if err := readSettings(fsys, dir+"contract.json", &ts); err != nil {
				return nil, err
			}
			if ts.Require != nil {
				return nil, fmt.Errorf("contracts: %scontract.json sets \"require\", which only contracts.json at the top may set", dir)
			}
			if ts.Compatibility != "" {
				t.Compatibility = ts.Compatibility
			}
			if !t.Compatibility.Valid() {
				return nil, fmt.Errorf("contracts: type %s: compatibility %q; use one of %s", name, t.Compatibility, compatList())
			}
			s.types[name] = t
		}
		sch, err := c.Compile(baseURL + p)
		if err != nil {
			return nil, fmt.Errorf("contracts: %s: %v", p, err)
		}
		raw, _ := fs.ReadFile(fsys, p)
		t.Versions = append(t.Versions, &Version{Number: n, Path: p, Raw: raw, Doc: doc, schema: sch})
	}
	for _, t := range s.types {
		sort.Slice(t.Versions, func(i, j int) bool { return t.Versions[i].Number < t.Versions[j].Number })
	}
	return s, nil
}

// addResources decodes every JSON file of fsys but the settings files and
// adds it to c as a resource, so a schema can $ref a shared one; it
// returns the decoded documents by path.
func addResources(fsys fs.FS, c *jsonschema.Compiler) (map[string]any, error) {
	docs := map[string]any{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != "." && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() || !strings.HasSuffix(p, ".json") || p == "contracts.json" || path.Base(p) == "contract.json" {
			return nil
		}
		raw, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			return fmt.Errorf("contracts: %s is not valid JSON: %v", p, err)
		}
		docs[p] = doc
		return c.AddResource(baseURL+p, doc)
	})
	return docs, err
}

func compatList() string {
	names := make([]string, len(Compatibilities))
	for i, c := range Compatibilities {
		names[i] = string(c)
	}
	return strings.Join(names, ", ")
}

// versionOf parses "v12.schema.json" as 12.
func versionOf(file string) (int, bool) {
	num, ok := strings.CutSuffix(strings.TrimPrefix(file, "v"), ".schema.json")
	if !ok || !strings.HasPrefix(file, "v") || num == "" || num[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

func readSettings(fsys fs.FS, name string, into *settings) error {
	raw, err := fs.ReadFile(fsys, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("contracts: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("contracts: %s: %v; it holds {\"compatibility\": \"BACKWARD\"} (and, in contracts.json only, \"require\": true|false)", name, err)
	}
	if into.Compatibility != "" && !into.Compatibility.Valid() {
		return fmt.Errorf("contracts: %s: compatibility %q; use one of %s", name, into.Compatibility, compatList())
	}
	return nil
}

// noRemote refuses every $ref outside the directory.
type noRemote struct{}

func (noRemote) Load(url string) (any, error) {
	return nil, fmt.Errorf("$ref %s is outside the contracts directory; contracts may only refer to files of their own directory", url)
}

// Violation is a payload that breaks its contract: where, and which rule.
type Violation struct {
	// Type and Version are the contract that was checked.
	Type    string
	Version int
	// Pointer is the JSON pointer (RFC 6901) of the offending value in the
	// payload: "" for the whole payload, "/total_cents", "/lines/0/sku".
	Pointer string
	// Rule is the JSON pointer of the failing keyword in the schema, e.g.
	// "/properties/total_cents/type" or "/required".
	Rule string
	// Message says what is wrong, in the validator's words.
	Message string
}

func (v *Violation) Error() string {
	ptr := v.Pointer
	if ptr == "" {
		ptr = "(the payload itself)"
	}
	return fmt.Sprintf("contracts: %s v%d: at %s: %s (rule %s)", v.Type, v.Version, ptr, v.Message, v.Rule)
}

// Check validates payload, a JSON document, against version (0: the
// latest) of eventType's contract, and returns the version it checked. A
// type without a contract passes unchecked with version 0, unless the set
// requires one (ErrNoContract). A payload that breaks the contract gets a
// *Violation. Check implements outbox.Contracts.
func (s *Set) Check(eventType string, version int, payload []byte) (int, error) {
	t := s.Type(eventType)
	if t == nil {
		if s != nil && s.Require {
			return 0, fmt.Errorf("%w: %q; add %s/v1.schema.json to the contracts directory, or set \"require\": false in contracts.json", ErrNoContract, eventType, eventType)
		}
		return 0, nil
	}
	v := t.Latest()
	if version != 0 {
		if v = t.Version(version); v == nil {
			have := make([]string, len(t.Versions))
			for i, tv := range t.Versions {
				have[i] = "v" + strconv.Itoa(tv.Number)
			}
			return 0, fmt.Errorf("%w: %s v%d; its contract has %s", ErrUnknownVersion, eventType, version, strings.Join(have, ", "))
		}
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return v.Number, &Violation{Type: eventType, Version: v.Number, Message: "payload is not valid JSON: " + err.Error()}
	}
	if err := v.schema.Validate(inst); err != nil {
		var ve *jsonschema.ValidationError
		if !errors.As(err, &ve) {
			return v.Number, fmt.Errorf("contracts: %s v%d: %w", eventType, v.Number, err)
		}
		return v.Number, violation(eventType, v.Number, ve)
	}
	return v.Number, nil
}

// violation picks the first leaf of the validator's error tree: the most
// specific reason, where a user looks first.
func violation(typ string, version int, ve *jsonschema.ValidationError) *Violation {
	out := ve.BasicOutput()
	leaf := out
	for _, e := range out.Errors {
		if e.Error != nil {
			leaf = &e
			break
		}
	}
	msg := ""
	if leaf.Error != nil {
		msg = leaf.Error.String()
	}
	return &Violation{Type: typ, Version: version, Pointer: leaf.InstanceLocation, Rule: leaf.KeywordLocation, Message: msg}
}
