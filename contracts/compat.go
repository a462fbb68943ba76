package contracts

import (
	"encoding/json"
	"fmt"
	"math/big"
	"net/url"
	"path"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Direction is the way a change breaks: which side can no longer read
// the other's events.
type Direction string

const (
	// DirBackward: a consumer reading with the later version rejects an
	// event written with the earlier one.
	DirBackward Direction = "backward"
	// DirForward: a consumer reading with the earlier version rejects an
	// event written with the later one.
	DirForward Direction = "forward"
)

// Break is one breaking change between two versions of a schema.
type Break struct {
	// Pointer is where in the schema the change is, as a JSON pointer
	// (RFC 6901; "" is the whole schema) along the path both versions
	// share: "/properties/total", "/items/properties/sku". A $ref is
	// followed as if its target were written in place, so the pointer
	// names the place in the event, not the file of a shared definition.
	Pointer string `json:"pointer"`
	// Rule is the change's stable snake_case code, e.g. type_narrowed,
	// required_property_added (docs/contracts.md lists them all). It
	// names the change from the earlier version to the later one.
	Rule string `json:"rule"`
	// Direction says which readers it breaks.
	Direction Direction `json:"direction"`
	// Message says what changed, in a sentence.
	Message string `json:"message"`
}

func (b Break) String() string {
	ptr := b.Pointer
	if ptr == "" {
		ptr = "(root)"
	}
	return fmt.Sprintf("%s: %s [%s]", ptr, b.Message, b.Rule)
}

// CompareSchemas reports every change from earlier to later, two
// decoded JSON Schema documents (Version.Doc), that breaks mode: with
// Backward, what a reader using later would reject of earlier's events;
// with Forward, what a reader using earlier would reject of later's;
// both with Full; nothing with None. The _TRANSITIVE forms compare the
// same way (which pairs to compare is the caller's: Compare does it).
// A $ref to another file cannot be resolved here and is reported as
// unresolved_ref; Set.CompareVersions resolves them.
func CompareSchemas(earlier, later any, mode Compatibility) []Break {
	return compareDocs(&docCtx{root: earlier}, &docCtx{root: later}, mode)
}

func compareDocs(earlier, later *docCtx, mode Compatibility) []Break {
	var out []Break
	if mode.Backward() {
		c := newChecker(DirBackward)
		c.check([]node{{v: earlier.root, doc: earlier}}, node{v: later.root, doc: later}, "")
		out = append(out, c.breaks...)
	}
	if mode.Forward() {
		c := newChecker(DirForward)
		c.check([]node{{v: later.root, doc: later}}, node{v: earlier.root, doc: earlier}, "")
		out = append(out, c.breaks...)
	}
	return out
}

// docCtx is the document a schema node belongs to, for its $refs.
type docCtx struct {
	// path is the file in its set ("order.placed/v2.schema.json"), ""
	// for a document given alone.
	path string
	root any
	// files are every JSON file of the set, by path; nil when alone.
	files map[string]any
}

// node is one schema (a JSON object or boolean) in its document. The
// checker sees a schema as a list of nodes that all apply: allOf and
// $ref beside other keywords are flattened into it.
type node struct {
	v   any
	doc *docCtx
	// unresolved is why a $ref could not be followed.
	unresolved string
	// partial: the node is a schema less its allOf/$ref, and holds a
	// keyword (unevaluatedProperties, ...) whose meaning depends on them,
	// so equal text proves nothing.
	partial bool
}

func (n node) obj() map[string]any { m, _ := n.v.(map[string]any); return m }

// Type bits: "number" is integer|fraction, so that integer ⊂ number is
// a subset test.
type typeSet uint8

const (
	tNull typeSet = 1 << iota
	tBoolean
	tString
	tArray
	tObject
	tInteger
	tFraction
	tAll     = tNull | tBoolean | tString | tArray | tObject | tInteger | tFraction
	tNumbers = tInteger | tFraction
)

var typeNames = map[string]typeSet{
	"null": tNull, "boolean": tBoolean, "string": tString, "array": tArray,
	"object": tObject, "integer": tInteger, "number": tNumbers,
}

func (t typeSet) String() string {
	if t == 0 {
		return "nothing"
	}
	if t == tAll {
		return "any type"
	}
	var names []string
	for _, n := range []string{"array", "boolean", "integer", "null", "number", "object", "string"} {
		b := typeNames[n]
		if t&b != b || (n == "integer" && t&tFraction != 0) {
			continue
		}
		names = append(names, n)
	}
	if t&tNumbers == tFraction {
		names = append(names, "non-integer number")
	}
	sort.Strings(names)
	if len(names) == 1 {
		return names[0]
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// nodeTypes is what the "type" keyword of m allows, tAll without one; ok
// is false when the keyword is malformed.
func nodeTypes(m map[string]any) (typeSet, bool) {
	raw, has := m["type"]
	if !has {
		return tAll, true
	}
	var t typeSet
	switch v := raw.(type) {
	case string:
		if b, ok := typeNames[v]; ok {
			return b, true
		}
		return tAll, false
	case []any:
		for _, e := range v {
			s, _ := e.(string)
			b, ok := typeNames[s]
			if !ok {
				return tAll, false
			}
			t |= b
		}
		return t, true
	}
	return tAll, false
}

// keywords the checker compares. Others it does not understand: a reader
// with one passes only when the writer has the same keyword with the
// same value (or the whole subschema is unchanged).
var understood = map[string]bool{
	"type": true, "enum": true, "const": true,
	"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true, "multipleOf": true,
	"minLength": true, "maxLength": true, "pattern": true, "format": true,
	"items": true, "prefixItems": true, "additionalItems": true, "minItems": true, "maxItems": true, "uniqueItems": true,
	"properties": true, "required": true, "additionalProperties": true, "patternProperties": true,
	"minProperties": true, "maxProperties": true,
	"allOf": true, "anyOf": true, "oneOf": true, "$ref": true,
}

// annotations constrain nothing.
var annotations = map[string]bool{
	"$schema": true, "$id": true, "$comment": true, "$defs": true, "definitions": true, "$anchor": true,
	"$dynamicAnchor": true, "$vocabulary": true, "title": true, "description": true, "default": true,
	"examples": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"contentMediaType": true, "contentEncoding": true, "contentSchema": true,
}

// groups are keywords that mean something only together: compared as one.
var groups = map[string][]string{
	"if": {"if", "then", "else"}, "then": {"if", "then", "else"}, "else": {"if", "then", "else"},
	"contains": {"contains", "minContains", "maxContains"}, "minContains": {"contains", "minContains", "maxContains"},
	"maxContains": {"contains", "minContains", "maxContains"},
}

// neverProven are keywords whose meaning depends on the rest of the
// schema, so an equal value proves nothing when anything beside changed.
var neverProven = map[string]bool{"unevaluatedProperties": true, "unevaluatedItems": true}

type checker struct {
	dir    Direction
	breaks []Break
	seen   map[string]bool
	// active are the (writer, reader) pairs being checked, so that a
	// recursive schema ends: a pair met again is assumed to hold.
	active map[string]bool
	depth  int
	// pending is the writer's anyOf/oneOf branch the next check reads.
	pending *branchOf
	// stripped are schemas less some keywords, made once each, so that a
	// recursive schema meets the same node again and ends.
	stripped map[string]map[string]any
	// steps counts checks, so that a schema whose choices multiply ends.
	steps int
}

// maxSteps bounds the work on one pair of schemas.
const maxSteps = 200_000

// strip is m less keys, the same map each time for the same m and keys.
func (c *checker) strip(m map[string]any, keys ...string) map[string]any {
	id := identity(m) + "-" + strings.Join(keys, ",")
	if out, ok := c.stripped[id]; ok {
		return out
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		if !slices.Contains(keys, k) {
			out[k] = v
		}
	}
	c.stripped[id] = out
	return out
}

// branchOf is one branch of a writer's anyOf/oneOf, checked on its own.
type branchOf struct {
	kw  string
	i   int
	n   int // the writer's number of branches
	ptr string
}

func newChecker(dir Direction) *checker {
	return &checker{dir: dir, seen: map[string]bool{}, active: map[string]bool{}, stripped: map[string]map[string]any{}}
}

// add records a break. narrow is the rule when the later version is the
// narrower one (the backward direction: the reader is the later
// version), widen when it is the wider.
func (c *checker) add(ptr, narrow, widen, msg string) {
	rule := narrow
	if c.dir == DirForward {
		rule = widen
	}
	c.record([]Break{{Pointer: ptr, Rule: rule, Direction: c.dir, Message: msg}})
}

// addf is add with a message formatted from the earlier value and the
// later one, in that order; w is the writer's, r the reader's.
func (c *checker) addf(ptr, narrow, widen, format string, w, r any) {
	old, new := w, r
	if c.dir == DirForward {
		old, new = r, w
	}
	c.add(ptr, narrow, widen, fmt.Sprintf(format, old, new))
}

// pick is the backward word or the forward one.
func (c *checker) pick(backward, forward string) string {
	if c.dir == DirBackward {
		return backward
	}
	return forward
}

// sub runs a nested check and returns its breaks without recording them.
func (c *checker) sub(ws []node, r node, ptr string) []Break {
	saved, savedSeen := c.breaks, c.seen
	c.breaks, c.seen = nil, map[string]bool{}
	c.check(ws, r, ptr)
	out := c.breaks
	c.breaks, c.seen = saved, savedSeen
	return out
}

func (c *checker) record(bs []Break) {
	for _, b := range bs {
		key := b.Pointer + "\x00" + b.Rule + "\x00" + b.Message
		if !c.seen[key] {
			c.seen[key] = true
			c.breaks = append(c.breaks, b)
		}
	}
}

const maxDepth = 64

// check records what reader r rejects of what the writer accepts; the
// writer is the conjunction ws.
func (c *checker) check(ws []node, r node, ptr string) {
	c.depth++
	defer func() { c.depth-- }()
	c.steps++
	if c.depth > maxDepth || c.steps > maxSteps {
		c.add(ptr, "schema_too_deep", "schema_too_deep", "the schema nests deeper, or its choices multiply further, than the checker follows; check this part by hand")
		return
	}
	var writers []node
	for _, w := range ws {
		writers = append(writers, c.flatten(w, 0)...)
	}
	from := c.pending
	c.pending = nil
	key := pairKey(writers, r)
	if c.active[key] {
		return
	}
	c.active[key] = true
	defer delete(c.active, key)

	// A writer's anyOf/oneOf: each branch must be readable on its own.
	for i, w := range writers {
		m := w.obj()
		for _, kw := range []string{"anyOf", "oneOf"} {
			branches, ok := m[kw].([]any)
			if !ok {
				continue
			}
			rest := slices.Clone(writers)
			rest[i] = node{v: c.strip(m, kw), doc: w.doc}
			for j, b := range branches {
				bptr := ptr + "/" + kw + "/" + strconv.Itoa(j)
				c.pending = &branchOf{kw: kw, i: j, n: len(branches), ptr: bptr}
				c.check(append(slices.Clone(rest), node{v: b, doc: w.doc}), r, bptr)
			}
			return
		}
	}
	for _, rn := range c.flatten(r, 0) {
		c.checkNode(writers, rn, ptr, from)
	}
}

func pairKey(ws []node, r node) string {
	var b strings.Builder
	for _, w := range ws {
		b.WriteString(identity(w.v))
		b.WriteByte(',')
	}
	b.WriteByte('|')
	b.WriteString(identity(r.v))
	return b.String()
}

func identity(v any) string {
	if m, ok := v.(map[string]any); ok {
		return strconv.FormatUint(uint64(reflect.ValueOf(m).Pointer()), 16) + ":" + strconv.Itoa(len(m))
	}
	return fmt.Sprint(v)
}

// flatten expands $ref and allOf into the list of nodes that all apply.
func (c *checker) flatten(n node, depth int) []node {
	m := n.obj()
	if m == nil || n.unresolved != "" {
		return []node{n}
	}
	if depth > maxDepth {
		return []node{{doc: n.doc, unresolved: "$ref chain too deep (a $ref cycle?)"}}
	}
	_, hasRef := m["$ref"]
	_, hasAll := m["allOf"]
	if !hasRef && !hasAll {
		return []node{n}
	}
	_, ue1 := m["unevaluatedProperties"]
	_, ue2 := m["unevaluatedItems"]
	out := []node{{v: c.strip(m, "$ref", "allOf"), doc: n.doc, partial: ue1 || ue2}}
	if hasRef {
		ref, _ := m["$ref"].(string)
		t, err := resolve(ref, n.doc)
		if err != nil {
			out = append(out, node{doc: n.doc, unresolved: err.Error()})
		} else {
			out = append(out, c.flatten(t, depth+1)...)
		}
	}
	if all, ok := m["allOf"].([]any); ok {
		for _, b := range all {
			out = append(out, c.flatten(node{v: b, doc: n.doc}, depth+1)...)
		}
	}
	return out
}

// resolve follows a $ref: a JSON pointer in the same document ("#/$defs/x")
// or a file of the same set by its relative path, with an optional
// pointer ("../_defs/money.schema.json#/$defs/cents"). Anchors, $id-based
// and remote references are not followed.
func resolve(ref string, d *docCtx) (node, error) {
	file, frag, _ := strings.Cut(ref, "#")
	target := d
	if file != "" {
		if rest, ok := strings.CutPrefix(file, baseURL); ok {
			file = "/" + rest
		} else if strings.Contains(file, ":") {
			return node{}, fmt.Errorf("$ref %q is not a file of the contracts directory", ref)
		}
		if d.files == nil {
			return node{}, fmt.Errorf("$ref %q names another file, which this comparison cannot read", ref)
		}
		p := path.Clean(path.Join(path.Dir(d.path), file))
		if strings.HasPrefix(file, "/") {
			p = strings.TrimPrefix(path.Clean(file), "/")
		}
		doc, ok := d.files[p]
		if !ok {
			return node{}, fmt.Errorf("$ref %q: no file %s in the contracts directory", ref, p)
		}
		target = &docCtx{path: p, root: doc, files: d.files}
	}
	if frag == "" {
		return node{v: target.root, doc: target}, nil
	}
	if !strings.HasPrefix(frag, "/") {
		return node{}, fmt.Errorf("$ref %q uses an anchor, which the checker does not follow", ref)
	}
	if u, err := url.PathUnescape(frag); err == nil {
		frag = u
	}
	cur := target.root
	for _, tok := range strings.Split(frag[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return node{}, fmt.Errorf("$ref %q points at nothing", ref)
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return node{}, fmt.Errorf("$ref %q points at nothing", ref)
			}
			cur = v[i]
		default:
			return node{}, fmt.Errorf("$ref %q points at nothing", ref)
		}
	}
	return node{v: cur, doc: target}, nil
}

// hasRef reports whether v holds a $ref anywhere: an unchanged subschema
// with one may still point at a changed definition.
func hasRef(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if k == "$ref" || k == "$dynamicRef" || k == "$recursiveRef" || hasRef(e) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if hasRef(e) {
				return true
			}
		}
	}
	return false
}

// writerFacts is what the conjunction of writer nodes allows.
type writerFacts struct {
	types typeSet
	// values is the writer's finite set of scalar values (enum, const,
	// or a type of null/boolean only), nil when not finite.
	values []any
	finite bool
}

func facts(ws []node) writerFacts {
	f := writerFacts{types: tAll}
	for _, w := range ws {
		if w.unresolved != "" {
			continue
		}
		if b, ok := w.v.(bool); ok {
			if !b {
				f.types = 0
			}
			continue
		}
		m := w.obj()
		if m == nil {
			continue
		}
		t, _ := nodeTypes(m)
		f.types &= t
		var vals []any
		has := false
		if e, ok := m["enum"].([]any); ok {
			vals, has = e, true
		}
		if cv, ok := m["const"]; ok {
			vals, has = []any{cv}, true
		}
		if !has {
			continue
		}
		if !f.finite {
			f.values, f.finite = vals, true
			continue
		}
		var keep []any
		for _, v := range f.values {
			if slices.ContainsFunc(vals, func(o any) bool { return jsonEqual(v, o) }) {
				keep = append(keep, v)
			}
		}
		f.values = keep
	}
	if !f.finite && f.types != 0 && f.types&^(tNull|tBoolean) == 0 {
		f.finite = true
		if f.types&tNull != 0 {
			f.values = append(f.values, nil)
		}
		if f.types&tBoolean != 0 {
			f.values = append(f.values, false, true)
		}
	}
	if f.finite {
		var keep []any
		var types typeSet
		for _, v := range f.values {
			if t := valueType(v); t&f.types != 0 {
				keep = append(keep, v)
				types |= t
			}
		}
		f.values, f.types = keep, types
		// Objects and arrays are compared by structure, not by value.
		for _, v := range f.values {
			if t := valueType(v); t == tObject || t == tArray {
				f.finite = false
			}
		}
	}
	return f
}

func (c *checker) checkNode(ws []node, rn node, ptr string, from *branchOf) {
	if rn.unresolved != "" {
		c.add(ptr, "unresolved_ref", "unresolved_ref", rn.unresolved+"; check this part by hand")
		return
	}
	if b, ok := rn.v.(bool); ok {
		if b {
			return
		}
		if f := facts(ws); f.types != 0 && !(f.finite && len(f.values) == 0) {
			c.addf(ptr, "type_narrowed", "type_widened", "type "+c.pick("narrowed", "widened")+" from %v to %v", f.types, typeSet(0))
		}
		return
	}
	rm := rn.obj()
	if rm == nil {
		c.add(ptr, "unsupported_keyword", "unsupported_keyword", fmt.Sprintf("the schema is %v, neither an object nor a boolean", rn.v))
		return
	}
	// An unchanged subschema with nothing that points elsewhere holds.
	if !hasRef(rm) && !rn.partial {
		for _, w := range ws {
			if w.unresolved == "" && !w.partial && jsonEqual(constraints(w.obj()), constraints(rm)) {
				return
			}
		}
	}
	f := facts(ws)
	if f.types == 0 || (f.finite && len(f.values) == 0) {
		return
	}
	rt, ok := nodeTypes(rm)
	if !ok {
		c.add(ptr, "unsupported_keyword", "unsupported_keyword", fmt.Sprintf("\"type\": %v is not a JSON Schema type", jsonText(rm["type"])))
	}
	if miss := f.types &^ rt; miss != 0 {
		rule, wrule, verb := "type_narrowed", "type_widened", c.pick("narrowed", "widened")
		if f.types&rt == 0 {
			rule, wrule, verb = "type_changed", "type_changed", "changed"
		}
		c.addf(ptr, rule, wrule, "type "+verb+" from %v to %v", f.types, rt)
		f.types &= rt
		if f.types == 0 {
			return
		}
	}
	if f.finite {
		c.checkValues(f, rm, ptr)
	} else {
		c.checkEnum(rm, ptr)
		if f.types&tNumbers != 0 {
			c.checkNumbers(ws, rm, ptr, f.types&tNumbers == tInteger)
		}
		if f.types&tString != 0 {
			c.checkStrings(ws, rm, ptr)
		}
	}
	if f.types&tArray != 0 {
		c.checkArrays(ws, rm, rn.doc, ptr)
	}
	if f.types&tObject != 0 {
		c.checkObjects(ws, rm, rn.doc, ptr)
	}
	c.checkFormat(ws, rm, ptr)
	c.checkChoices(ws, rm, rn.doc, ptr, from)
	c.checkUnknown(ws, rm, ptr)
}

// checkValues: a writer with a finite set of values; each must pass r.
func (c *checker) checkValues(f writerFacts, rm map[string]any, ptr string) {
	_, rEnum := rm["enum"]
	for _, v := range f.values {
		kw, why := rejects(rm, v)
		if kw == "" {
			continue
		}
		switch kw {
		case "enum", "const":
			_, isConst := rm["const"]
			rule, wrule := "enum_value_removed", "enum_value_added"
			if isConst || len(f.values) == 1 && !rEnum {
				rule, wrule = "const_changed", "const_changed"
			}
			c.add(ptr, rule, wrule, c.pick("value "+jsonText(v)+" no longer allowed", "value "+jsonText(v)+" newly allowed"))
		default:
			narrow, widen := keywordRules(kw)
			c.add(ptr, narrow, widen, c.pick("value "+jsonText(v)+" no longer allowed: "+why, "value "+jsonText(v)+" newly allowed, where the earlier version had "+why))
		}
	}
}

// keywordRules are the rule codes for a value keyword that rejects.
func keywordRules(kw string) (narrow, widen string) {
	switch kw {
	case "minimum", "exclusiveMinimum":
		return "minimum_tightened", "minimum_loosened"
	case "maximum", "exclusiveMaximum":
		return "maximum_tightened", "maximum_loosened"
	case "multipleOf":
		return "multiple_of_tightened", "multiple_of_loosened"
	case "minLength":
		return "min_length_tightened", "min_length_loosened"
	case "maxLength":
		return "max_length_tightened", "max_length_loosened"
	case "pattern":
		return "pattern_changed", "pattern_changed"
	case "type":
		return "type_narrowed", "type_widened"
	}
	return "unsupported_keyword", "unsupported_keyword"
}

// rejects names the keyword of rm that rejects the scalar v, "" when
// none does.
func rejects(rm map[string]any, v any) (kw, why string) {
	if t, ok := nodeTypes(rm); ok && valueType(v)&t == 0 {
		return "type", "type " + t.String()
	}
	if e, ok := rm["enum"].([]any); ok && !slices.ContainsFunc(e, func(o any) bool { return jsonEqual(v, o) }) {
		return "enum", "enum"
	}
	if cv, ok := rm["const"]; ok && !jsonEqual(cv, v) {
		return "const", "const"
	}
	if n, ok := num(v); ok {
		lo, hi := bounds(rm)
		if lo != nil && (n.Cmp(lo.v) < 0 || lo.excl && n.Cmp(lo.v) == 0) {
			return lo.kw, lo.kw + " " + lo.v.RatString()
		}
		if hi != nil && (n.Cmp(hi.v) > 0 || hi.excl && n.Cmp(hi.v) == 0) {
			return hi.kw, hi.kw + " " + hi.v.RatString()
		}
		if m, ok := num(rm["multipleOf"]); ok && m.Sign() > 0 && !new(big.Rat).Quo(n, m).IsInt() {
			return "multipleOf", "multipleOf " + m.RatString()
		}
	}
	if s, ok := v.(string); ok {
		l := len([]rune(s))
		if n, ok := intOf(rm["minLength"]); ok && l < n {
			return "minLength", "minLength " + strconv.Itoa(n)
		}
		if n, ok := intOf(rm["maxLength"]); ok && l > n {
			return "maxLength", "maxLength " + strconv.Itoa(n)
		}
		if p, ok := rm["pattern"].(string); ok {
			re, err := regexp.Compile(p)
			if err != nil || !re.MatchString(s) {
				return "pattern", "pattern " + strconv.Quote(p)
			}
		}
	}
	return "", ""
}

// checkEnum: a writer with no finite set against a reader that has one.
func (c *checker) checkEnum(rm map[string]any, ptr string) {
	if cv, ok := rm["const"]; ok {
		c.add(ptr, "const_added", "const_removed", c.pick("const "+jsonText(cv)+" added", "const "+jsonText(cv)+" removed"))
		return
	}
	if e, ok := rm["enum"]; ok {
		c.add(ptr, "enum_added", "enum_removed", c.pick("enum "+jsonText(e)+" added", "enum "+jsonText(e)+" removed"))
	}
}

type bound struct {
	v    *big.Rat
	excl bool
	kw   string
}

// bounds are m's lower and upper numeric bounds (nil: none), with the
// draft-04 boolean exclusiveMinimum/exclusiveMaximum understood.
func bounds(m map[string]any) (lo, hi *bound) {
	if v, ok := num(m["minimum"]); ok {
		lo = &bound{v: v, kw: "minimum", excl: m["exclusiveMinimum"] == true}
	}
	if v, ok := num(m["exclusiveMinimum"]); ok && (lo == nil || v.Cmp(lo.v) >= 0) {
		lo = &bound{v: v, excl: true, kw: "exclusiveMinimum"}
	}
	if v, ok := num(m["maximum"]); ok {
		hi = &bound{v: v, kw: "maximum", excl: m["exclusiveMaximum"] == true}
	}
	if v, ok := num(m["exclusiveMaximum"]); ok && (hi == nil || v.Cmp(hi.v) <= 0) {
		hi = &bound{v: v, excl: true, kw: "exclusiveMaximum"}
	}
	return lo, hi
}

func (b *bound) String() string {
	if b == nil {
		return "none"
	}
	if b.excl {
		return "exclusive " + b.v.RatString()
	}
	return b.v.RatString()
}

// tighter: is a stricter than b as a lower (sign 1) or upper (sign -1)
// bound? A nil bound is the loosest.
func tighter(a, b *bound, sign int) bool {
	if a == nil {
		return false
	}
	if b == nil {
		return true
	}
	c := a.v.Cmp(b.v) * sign
	return c > 0 || c == 0 && a.excl && !b.excl
}

func (c *checker) checkNumbers(ws []node, rm map[string]any, ptr string, integers bool) {
	var wlo, whi *bound
	var wmul []*big.Rat
	for _, w := range ws {
		m := w.obj()
		if m == nil {
			continue
		}
		lo, hi := bounds(m)
		if tighter(lo, wlo, 1) {
			wlo = lo
		}
		if tighter(hi, whi, -1) {
			whi = hi
		}
		if v, ok := num(m["multipleOf"]); ok && v.Sign() > 0 {
			wmul = append(wmul, v)
		}
	}
	rlo, rhi := bounds(rm)
	if integers {
		// For integers, exclusive n and inclusive n+1 are one bound.
		wlo, whi, rlo, rhi = intBound(wlo, 1), intBound(whi, -1), intBound(rlo, 1), intBound(rhi, -1)
	}
	if tighter(rlo, wlo, 1) {
		c.addf(ptr, "minimum_tightened", "minimum_loosened", "minimum changed from %v to %v", wlo, rlo)
	}
	if tighter(rhi, whi, -1) {
		c.addf(ptr, "maximum_tightened", "maximum_loosened", "maximum changed from %v to %v", whi, rhi)
	}
	if rmul, ok := num(rm["multipleOf"]); ok && rmul.Sign() > 0 {
		covered := integers && rmul.IsInt() && rmul.Num().IsInt64() && rmul.Num().Int64() == 1
		for _, wm := range wmul {
			if new(big.Rat).Quo(wm, rmul).IsInt() {
				covered = true
			}
		}
		if !covered {
			var was any = "none"
			if len(wmul) > 0 {
				was = wmul[0].RatString()
			}
			if len(wmul) > 0 && !new(big.Rat).Quo(rmul, wmul[0]).IsInt() {
				c.addf(ptr, "multiple_of_changed", "multiple_of_changed", "multipleOf changed from %v to %v", was, rmul.RatString())
			} else {
				c.addf(ptr, "multiple_of_tightened", "multiple_of_loosened", "multipleOf changed from %v to %v", was, rmul.RatString())
			}
		}
	}
}

// intBound turns an exclusive bound into the inclusive integer one.
func intBound(b *bound, sign int) *bound {
	if b == nil {
		return nil
	}
	v := new(big.Rat).Set(b.v)
	i := new(big.Int)
	if sign > 0 {
		// ceil, +1 when exclusive and whole
		i.Quo(v.Num(), v.Denom())
		if v.Sign() > 0 && !v.IsInt() {
			i.Add(i, big.NewInt(1))
		}
		if b.excl && v.IsInt() {
			i.Add(i, big.NewInt(1))
		}
	} else {
		i.Quo(v.Num(), v.Denom())
		if v.Sign() < 0 && !v.IsInt() {
			i.Sub(i, big.NewInt(1))
		}
		if b.excl && v.IsInt() {
			i.Sub(i, big.NewInt(1))
		}
	}
	return &bound{v: new(big.Rat).SetInt(i), kw: b.kw}
}

// limits are the writer's tightest minimum (max over nodes) and maximum
// (min over nodes) of an integer keyword pair; -1 for none.
func limits(ws []node, minKw, maxKw string) (lo, hi int) {
	lo, hi = -1, -1
	for _, w := range ws {
		m := w.obj()
		if n, ok := intOf(m[minKw]); ok && n > lo {
			lo = n
		}
		if n, ok := intOf(m[maxKw]); ok && (hi < 0 || n < hi) {
			hi = n
		}
	}
	return lo, hi
}

func showLimit(n int) any {
	if n < 0 {
		return "none"
	}
	return n
}

// checkLimits compares a min/max pair of integer keywords (lengths,
// item and property counts); rule is e.g. "length" for min_length_*.
func (c *checker) checkLimits(ws []node, rm map[string]any, ptr, minKw, maxKw, rule string) {
	wlo, whi := limits(ws, minKw, maxKw)
	if rlo, ok := intOf(rm[minKw]); ok && rlo > 0 && rlo > wlo {
		c.addf(ptr, "min_"+rule+"_tightened", "min_"+rule+"_loosened", minKw+" changed from %v to %v", showLimit(wlo), rlo)
	}
	if rhi, ok := intOf(rm[maxKw]); ok && (whi < 0 || rhi < whi) {
		c.addf(ptr, "max_"+rule+"_tightened", "max_"+rule+"_loosened", maxKw+" changed from %v to %v", showLimit(whi), rhi)
	}
}

func (c *checker) checkStrings(ws []node, rm map[string]any, ptr string) {
	c.checkLimits(ws, rm, ptr, "minLength", "maxLength", "length")
	rp, ok := rm["pattern"].(string)
	if !ok {
		return
	}
	var wps []string
	for _, w := range ws {
		if p, ok := w.obj()["pattern"].(string); ok {
			wps = append(wps, p)
		}
	}
	if slices.Contains(wps, rp) {
		return
	}
	if len(wps) == 0 {
		c.add(ptr, "pattern_added", "pattern_removed", c.pick("pattern "+strconv.Quote(rp)+" added", "pattern "+strconv.Quote(rp)+" removed"))
		return
	}
	// Whether one regular expression matches less than another is not
	// decided here: any change may break.
	c.addf(ptr, "pattern_changed", "pattern_changed", "pattern changed from %v to %v", strconv.Quote(wps[0]), strconv.Quote(rp))
}

func (c *checker) checkFormat(ws []node, rm map[string]any, ptr string) {
	rf, ok := rm["format"].(string)
	if !ok {
		return
	}
	var wfs []string
	for _, w := range ws {
		if f, ok := w.obj()["format"].(string); ok {
			wfs = append(wfs, f)
		}
	}
	switch {
	case slices.Contains(wfs, rf):
	case len(wfs) == 0:
		c.add(ptr, "format_added", "format_removed", c.pick("format "+strconv.Quote(rf)+" added", "format "+strconv.Quote(rf)+" removed"))
	default:
		c.addf(ptr, "format_changed", "format_changed", "format changed from %v to %v", strconv.Quote(wfs[0]), strconv.Quote(rf))
	}
}

// arrayShape is an array schema's per-position schemas and the schema
// of the items after them (nil: anything).
type arrayShape struct {
	prefix  []any
	rest    any
	hasRest bool
	// restKw is the keyword of rest, for pointers.
	restKw string
}

func shapeOf(m map[string]any) arrayShape {
	s := arrayShape{restKw: "items"}
	if p, ok := m["prefixItems"].([]any); ok {
		s.prefix = p
	}
	switch it := m["items"].(type) {
	case []any: // draft 2019-09 and earlier: items as a tuple
		s.prefix = it
		if a, ok := m["additionalItems"]; ok {
			s.rest, s.hasRest, s.restKw = a, true, "additionalItems"
		}
	case nil:
	default:
		s.rest, s.hasRest = it, true
	}
	return s
}

func (s arrayShape) at(i int) (any, bool, string) {
	if i < len(s.prefix) {
		return s.prefix[i], true, "/" + strconv.Itoa(i)
	}
	return s.rest, s.hasRest, ""
}

func (c *checker) checkArrays(ws []node, rm map[string]any, rd *docCtx, ptr string) {
	c.checkLimits(ws, rm, ptr, "minItems", "maxItems", "items")
	if rm["uniqueItems"] == true && !slices.ContainsFunc(ws, func(w node) bool { return w.obj()["uniqueItems"] == true }) {
		c.add(ptr, "unique_items_added", "unique_items_removed", c.pick("uniqueItems added", "uniqueItems removed"))
	}
	rs := shapeOf(rm)
	n := len(rs.prefix)
	for _, w := range ws {
		if m := w.obj(); m != nil {
			n = max(n, len(shapeOf(m).prefix))
		}
	}
	for i := 0; i <= n; i++ {
		var rsch any
		var has bool
		var where string
		if i < n {
			rsch, has, where = rs.at(i)
			if where == "" {
				where = "/" + rs.restKw
			} else {
				where = "/prefixItems" + where
				if _, tuple := rm["items"].([]any); tuple {
					where = "/items" + strings.TrimPrefix(where, "/prefixItems")
				}
			}
		} else {
			rsch, has, where = rs.rest, rs.hasRest, "/"+rs.restKw
		}
		if !has {
			continue
		}
		var wsch []node
		for _, w := range ws {
			m := w.obj()
			if m == nil {
				continue
			}
			s := shapeOf(m)
			var v any
			var ok bool
			if i < n {
				v, ok, _ = s.at(i)
			} else {
				v, ok = s.rest, s.hasRest
			}
			if ok {
				wsch = append(wsch, node{v: v, doc: w.doc})
			}
		}
		c.check(wsch, node{v: rsch, doc: rd}, ptr+where)
	}
}

// writerProp is what the writer nodes say of property name: the schemas
// that apply to it (all must hold), whether some node declares it in
// "properties", and whether some node forbids it (a closed model that
// does not declare it: the writer never writes it).
func writerProp(ws []node, name string) (schemas []node, declared, never bool) {
	for _, w := range ws {
		m := w.obj()
		if m == nil {
			continue
		}
		has := false
		if props, ok := m["properties"].(map[string]any); ok {
			if s, ok := props[name]; ok {
				schemas = append(schemas, node{v: s, doc: w.doc})
				declared, has = true, true
			}
		}
		if pats, ok := m["patternProperties"].(map[string]any); ok {
			for re, s := range pats {
				// A writer pattern that does not compile constrains
				// nothing here: the writer is taken as looser.
				if rx, err := regexp.Compile(re); err == nil && rx.MatchString(name) {
					schemas = append(schemas, node{v: s, doc: w.doc})
					has = true
				}
			}
		}
		if has {
			continue
		}
		switch a := m["additionalProperties"].(type) {
		case nil:
		case bool:
			if !a {
				never = true
			}
		default:
			schemas = append(schemas, node{v: a, doc: w.doc})
		}
	}
	return schemas, declared, never
}

// writerOthers is what the writer nodes say of a name none of them
// declares or matches by pattern: additionalProperties.
func writerOthers(ws []node) (schemas []node, never bool) {
	for _, w := range ws {
		m := w.obj()
		if m == nil {
			continue
		}
		switch a := m["additionalProperties"].(type) {
		case nil:
		case bool:
			// With patternProperties beside it, names matching them are
			// allowed; they are checked by their patterns.
			if !a && m["patternProperties"] == nil {
				never = true
			}
		default:
			schemas = append(schemas, node{v: a, doc: w.doc})
		}
	}
	return schemas, never
}

// constraints is m less its annotations (top level only).
func constraints(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		if !annotations[k] {
			out[k] = v
		}
	}
	return out
}

// trivial: a schema that accepts everything.
func trivial(v any) bool {
	if b, ok := v.(bool); ok {
		return b
	}
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	for k := range m {
		if !annotations[k] {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func escape(tok string) string {
	return strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1")
}

func firstMessage(bs []Break) string {
	if len(bs) == 0 {
		return ""
	}
	return bs[0].Message
}

func (c *checker) checkObjects(ws []node, rm map[string]any, rd *docCtx, ptr string) {
	c.checkLimits(ws, rm, ptr, "minProperties", "maxProperties", "properties")
	c.checkRequired(ws, rm, ptr)
	rprops, _ := rm["properties"].(map[string]any)
	c.checkProperties(ws, rprops, rd, ptr)

	rpats, _ := rm["patternProperties"].(map[string]any)
	var rres []*regexp.Regexp
	for _, q := range sortedKeys(rpats) {
		rx, err := regexp.Compile(q)
		if err == nil {
			rres = append(rres, rx)
		}
		c.checkPattern(ws, q, rx, rpats[q], rd, ptr)
	}

	c.checkAdditional(ws, rm, rprops, rpats, rres, rd, ptr)
}

// checkRequired reports the properties the reader requires and the
// writer does not.
func (c *checker) checkRequired(ws []node, rm map[string]any, ptr string) {
	if req, ok := rm["required"].([]any); ok {
		for _, e := range req {
			name, _ := e.(string)
			if !slices.ContainsFunc(ws, func(w node) bool {
				wr, _ := w.obj()["required"].([]any)
				return slices.Contains(wr, any(name))
			}) {
				c.add(ptr+"/properties/"+escape(name), "required_property_added", "required_property_removed",
					c.pick("property "+strconv.Quote(name)+" became required", "property "+strconv.Quote(name)+" is no longer required"))
			}
		}
	}
}

// checkProperties compares each property the reader declares with what
// the writer allows under that name.
func (c *checker) checkProperties(ws []node, rprops map[string]any, rd *docCtx, ptr string) {
	for _, name := range sortedKeys(rprops) {
		p := ptr + "/properties/" + escape(name)
		schemas, declared, never := writerProp(ws, name)
		switch {
		case never:
		case declared:
			c.check(schemas, node{v: rprops[name], doc: rd}, p)
		case len(schemas) == 0:
			if !trivial(rprops[name]) {
				c.add(p, "property_added_to_open_model", "property_removed_from_open_model",
					c.pick("property "+strconv.Quote(name)+" added while the earlier version's model is open: events written with it may hold any value there",
						"property "+strconv.Quote(name)+" removed while the model is open: events written with the later version may hold any value there"))
			}
		default:
			if bs := c.sub(schemas, node{v: rprops[name], doc: rd}, p); len(bs) > 0 {
				c.add(p, "property_added_not_covered", "property_removed_not_covered",
					c.pick("property "+strconv.Quote(name)+" added, and the earlier version's additionalProperties/patternProperties allowed other values there: ",
						"property "+strconv.Quote(name)+" removed, and the later version's additionalProperties/patternProperties allow other values there: ")+firstMessage(bs))
			}
		}
	}
}

// checkAdditional compares the reader's additionalProperties with the
// writer's properties it does not declare, and with the writer's own
// additionalProperties and patternProperties.
func (c *checker) checkAdditional(ws []node, rm, rprops, rpats map[string]any, rres []*regexp.Regexp, rd *docCtx, ptr string) {
	a, hasA := rm["additionalProperties"]
	if !hasA || trivial(a) {
		return
	}
	covered := func(name string) bool {
		if _, ok := rprops[name]; ok {
			return true
		}
		return slices.ContainsFunc(rres, func(rx *regexp.Regexp) bool { return rx.MatchString(name) })
	}
	closed := a == false
	ra := node{v: a, doc: rd}
	names := map[string]any{}
	for _, w := range ws {
		if props, ok := w.obj()["properties"].(map[string]any); ok {
			for k := range props {
				names[k] = true
			}
		}
	}
	for _, name := range sortedKeys(names) {
		if covered(name) {
			continue
		}
		schemas, _, never := writerProp(ws, name)
		if never {
			continue
		}
		p := ptr + "/properties/" + escape(name)
		bs := c.sub(schemas, ra, p)
		if len(bs) == 0 {
			continue
		}
		if closed {
			c.add(p, "property_removed_from_closed_model", "property_added_to_closed_model",
				c.pick("property "+strconv.Quote(name)+" removed while additionalProperties is false: events written with the earlier version have it",
					"property "+strconv.Quote(name)+" added where the earlier version has additionalProperties: false"))
		} else {
			c.add(p, "property_removed_not_covered", "property_added_not_covered",
				c.pick("property "+strconv.Quote(name)+" removed, and additionalProperties does not accept its earlier values: ",
					"property "+strconv.Quote(name)+" added, and the earlier version's additionalProperties does not accept its values: ")+firstMessage(bs))
		}
	}
	for _, w := range ws {
		pats, _ := w.obj()["patternProperties"].(map[string]any)
		for _, q := range sortedKeys(pats) {
			if _, same := rpats[q]; same {
				continue
			}
			p := ptr + "/patternProperties/" + escape(q)
			if bs := c.sub([]node{{v: pats[q], doc: w.doc}}, ra, p); len(bs) > 0 {
				c.add(p, "additional_properties_narrowed", "additional_properties_widened",
					c.pick("names matching pattern "+strconv.Quote(q)+" are no longer declared and additionalProperties rejects their earlier values",
						"names matching pattern "+strconv.Quote(q)+" are newly allowed where the earlier version's additionalProperties rejects them"))
			}
		}
	}
	schemas, never := writerOthers(ws)
	if never {
		return
	}
	p := ptr + "/additionalProperties"
	bs := c.sub(schemas, ra, p)
	if len(bs) == 0 {
		return
	}
	if closed && len(schemas) == 0 {
		c.add(p, "open_model_closed", "closed_model_opened",
			c.pick("additionalProperties: false added: events with properties the later version does not declare are rejected",
				"additionalProperties: false removed: events of the later version may hold properties the earlier version rejects"))
		return
	}
	c.add(p, "additional_properties_narrowed", "additional_properties_widened",
		c.pick("additionalProperties narrowed: ", "additionalProperties widened: ")+firstMessage(bs))
}

// checkPattern: the reader's patternProperties q (its schema s; rx nil
// when q does not compile) against what the writer allows under names
// matching q.
func (c *checker) checkPattern(ws []node, q string, rx *regexp.Regexp, s any, rd *docCtx, ptr string) {
	p := ptr + "/patternProperties/" + escape(q)
	rs := node{v: s, doc: rd}
	var same []node
	for _, w := range ws {
		if pats, ok := w.obj()["patternProperties"].(map[string]any); ok {
			if ws, ok := pats[q]; ok {
				same = append(same, node{v: ws, doc: w.doc})
			}
		}
	}
	if len(same) > 0 {
		c.check(same, rs, p)
		return
	}
	// Declared properties of the writer whose names match q.
	names := map[string]any{}
	for _, w := range ws {
		if props, ok := w.obj()["properties"].(map[string]any); ok {
			for k := range props {
				if rx == nil || rx.MatchString(k) {
					names[k] = true
				}
			}
		}
	}
	for _, name := range sortedKeys(names) {
		schemas, _, never := writerProp(ws, name)
		if !never {
			c.check(schemas, rs, ptr+"/properties/"+escape(name))
		}
	}
	schemas, never := writerOthers(ws)
	if never || trivial(s) {
		return
	}
	if bs := c.sub(schemas, rs, p); len(bs) > 0 {
		c.add(p, "pattern_property_added", "pattern_property_removed",
			c.pick("patternProperties "+strconv.Quote(q)+" added: events of the earlier version may hold other values under such names",
				"patternProperties "+strconv.Quote(q)+" removed: events of the later version may hold other values under such names"))
	}
}

// checkChoices: the reader's anyOf/oneOf. A writer (already one branch
// of its own anyOf/oneOf, if it had one) must fit one of its branches.
// oneOf is read as anyOf, as the Confluent registry does: adding a
// branch widens it, though an event matching two overlapping branches
// fails a oneOf.
func (c *checker) checkChoices(ws []node, rm map[string]any, rd *docCtx, ptr string, from *branchOf) {
	for _, kw := range []string{"anyOf", "oneOf"} {
		branches, ok := rm[kw].([]any)
		if !ok {
			continue
		}
		rule := map[string]string{"anyOf": "any_of", "oneOf": "one_of"}[kw]
		mine := from != nil && from.kw == kw && from.ptr == ptr
		fits := false
		var counterpart []Break
		for j, b := range branches {
			bptr := ptr + "/" + kw + "/" + strconv.Itoa(j)
			if mine {
				bptr = ptr
			}
			bs := c.sub(ws, node{v: b, doc: rd}, bptr)
			if len(bs) == 0 {
				fits = true
				break
			}
			// The branch at the same place, when there are as many,
			// is the same branch changed: its own breaks say more.
			if mine && j == from.i && len(branches) == from.n {
				counterpart = bs
			}
		}
		switch {
		case fits:
		case counterpart != nil:
			c.record(counterpart)
		case mine:
			c.add(ptr, rule+"_branch_removed", rule+"_branch_added",
				c.pick(kw+" branch "+strconv.Itoa(from.i)+" of the earlier version removed: no branch of the later version reads its events",
					kw+" branch "+strconv.Itoa(from.i)+" added: no branch of the earlier version reads its events"))
		default:
			c.add(ptr, rule+"_added", rule+"_removed",
				c.pick(kw+" added: events of the earlier version fit none of its branches",
					kw+" removed: events of the later version fit none of the earlier version's branches"))
		}
	}
}

// checkUnknown: keywords the checker does not compare hold only when the
// writer has them with the same value.
func (c *checker) checkUnknown(ws []node, rm map[string]any, ptr string) {
	done := map[string]bool{}
	for _, k := range sortedKeys(rm) {
		if understood[k] || annotations[k] || done[k] {
			continue
		}
		group := groups[k]
		if group == nil {
			group = []string{k}
		}
		for _, g := range group {
			done[g] = true
		}
		held := !neverProven[k] && slices.ContainsFunc(ws, func(w node) bool {
			m := w.obj()
			if m == nil {
				return false
			}
			for _, g := range group {
				if hasRef(rm[g]) || !jsonEqual(m[g], rm[g]) {
					return false
				}
			}
			return true
		})
		if !held {
			c.add(ptr, "unsupported_keyword", "unsupported_keyword",
				strconv.Quote(k)+" is not compared by the checker and differs between the versions (or depends on what does): check it by hand")
		}
	}
}

func num(v any) (*big.Rat, bool) {
	switch x := v.(type) {
	case json.Number:
		return new(big.Rat).SetString(string(x))
	case float64:
		r := new(big.Rat)
		if r.SetFloat64(x) == nil {
			return nil, false
		}
		return r, true
	case int:
		return new(big.Rat).SetInt64(int64(x)), true
	}
	return nil, false
}

func intOf(v any) (int, bool) {
	r, ok := num(v)
	if !ok || !r.IsInt() || r.Sign() < 0 || !r.Num().IsInt64() {
		return 0, false
	}
	return int(r.Num().Int64()), true
}

func valueType(v any) typeSet {
	switch x := v.(type) {
	case nil:
		return tNull
	case bool:
		return tBoolean
	case string:
		return tString
	case []any:
		return tArray
	case map[string]any:
		return tObject
	default:
		if r, ok := num(x); ok {
			if r.IsInt() {
				return tInteger
			}
			return tFraction
		}
	}
	return 0
}

// jsonEqual is JSON equality: numbers by value, objects by members.
func jsonEqual(a, b any) bool {
	if ra, ok := num(a); ok {
		rb, ok := num(b)
		return ok && ra.Cmp(rb) == 0
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !jsonEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	if _, ok := num(b); ok {
		return false
	}
	return a == b
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
