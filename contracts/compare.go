package contracts

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
)

// Severity says whether a finding fails the check.
type Severity string

const (
	// SeverityError fails `outbox contracts check` (exit status 1).
	SeverityError Severity = "error"
	// SeverityWarning is reported and does not fail it.
	SeverityWarning Severity = "warning"
)

// Rules of Compare about the set as a whole, beside the schema rules of
// Break.
const (
	// RulePublishedVersionChanged: a version in both sets whose schema
	// (or a file it $refs) differs other than in white space and key
	// order. An error: events were written and read with the published
	// text; a change is a new version.
	RulePublishedVersionChanged = "published_version_changed"
	// RuleLatestVersionRemoved: the earlier set's latest version is gone.
	// An error: producers that emit with version 0 fall back to an older
	// schema, and the number can come back later with other content.
	RuleLatestVersionRemoved = "latest_version_removed"
	// RuleVersionRemoved: an older version is gone. A warning: retiring
	// a version is allowed, once no producer writes it and no event of
	// it is left to read.
	RuleVersionRemoved = "version_removed"
	// RuleTypeRemoved: a type's folder is gone. An error when the set
	// requires contracts (Emit of that type now fails with
	// ErrNoContract), a warning when it does not (its events pass
	// unchecked).
	RuleTypeRemoved = "type_removed"
	// RuleCompatibilityChanged: a type's mode changed. A warning: the
	// versions are checked under the new mode.
	RuleCompatibilityChanged = "compatibility_changed"
)

// Finding is one thing Compare reports.
type Finding struct {
	// Type is the event type.
	Type string `json:"type"`
	// From and To are the versions compared (From the earlier); for a
	// finding about one version (published_version_changed,
	// version_removed) both are that version; 0 for the whole type.
	From int `json:"from"`
	To   int `json:"to"`
	// Mode is the type's compatibility mode in the set checked.
	Mode Compatibility `json:"mode"`
	// Severity is error or warning.
	Severity Severity `json:"severity"`
	// Rule is a Break's rule, or one of the Rule* constants.
	Rule string `json:"rule"`
	// Direction is backward or forward for a schema break, "" otherwise.
	Direction Direction `json:"direction"`
	// Pointer is where in the schema, for a schema break ("" is the
	// whole schema, as for the other findings).
	Pointer string `json:"pointer"`
	// Message says what is wrong.
	Message string `json:"message"`
}

// Report is what Compare found.
type Report struct {
	// Types and Versions count what the current set holds.
	Types    int `json:"types"`
	Versions int `json:"versions"`
	// Findings, by type, then as found.
	Findings []Finding `json:"findings"`
}

// Errors counts the findings that fail the check.
func (r *Report) Errors() int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == SeverityError {
			n++
		}
	}
	return n
}

// Compatible reports whether nothing fails the check.
func (r *Report) Compatible() bool { return r.Errors() == 0 }

// CompareVersions reports the breaks of version later against version
// earlier of one type of s under mode, following $refs among the set's
// files.
func (s *Set) CompareVersions(earlier, later *Version, mode Compatibility) []Break {
	return compareDocs(s.doc(earlier), s.doc(later), mode)
}

func (s *Set) doc(v *Version) *docCtx {
	return &docCtx{path: v.Path, root: v.Doc, files: s.files}
}

// Compare checks current: every type's versions against each other under
// its mode (each version against the one before it, or against every
// earlier one when the mode is transitive; nothing under NONE). With
// earlier (a set loaded from the last release or the main branch; nil
// for none) it also reports what changed since: published versions that
// changed, versions and types removed, modes changed.
func Compare(earlier, current *Set) *Report {
	rep := &Report{Findings: []Finding{}}
	for _, t := range current.Types() {
		rep.Types++
		rep.Versions += len(t.Versions)
		if earlier != nil {
			rep.Findings = append(rep.Findings, compareType(earlier, current, earlier.Type(t.Name), t)...)
		}
		rep.Findings = append(rep.Findings, current.checkType(t)...)
	}
	if earlier != nil {
		for _, et := range earlier.Types() {
			if current.Type(et.Name) != nil {
				continue
			}
			f := Finding{Type: et.Name, Mode: et.Compatibility, Severity: SeverityWarning, Rule: RuleTypeRemoved,
				Message: fmt.Sprintf("type removed (it had versions %s); its events now pass unchecked", versionList(et))}
			if current.Require {
				f.Severity = SeverityError
				f.Message = fmt.Sprintf("type removed (it had versions %s); contracts.json sets \"require\": true, so Emit of %s now fails with ErrNoContract: keep its folder while anything emits it", versionList(et), et.Name)
			}
			rep.Findings = append(rep.Findings, f)
		}
	}
	sort.SliceStable(rep.Findings, func(i, j int) bool { return rep.Findings[i].Type < rep.Findings[j].Type })
	return rep
}

func versionList(t *Type) string {
	vs := make([]string, len(t.Versions))
	for i, v := range t.Versions {
		vs[i] = fmt.Sprintf("v%d", v.Number)
	}
	return strings.Join(vs, ", ")
}

// checkType compares t's versions under its mode.
func (s *Set) checkType(t *Type) []Finding {
	var out []Finding
	mode := t.Compatibility
	if mode == None || mode == "" {
		return nil
	}
	for i := 1; i < len(t.Versions); i++ {
		later := t.Versions[i]
		from := i - 1
		if mode.Transitive() {
			from = 0
		}
		for j := i - 1; j >= from; j-- {
			earlier := t.Versions[j]
			for _, b := range s.CompareVersions(earlier, later, mode) {
				out = append(out, Finding{Type: t.Name, From: earlier.Number, To: later.Number, Mode: mode,
					Severity: SeverityError, Rule: b.Rule, Direction: b.Direction, Pointer: b.Pointer, Message: b.Message})
			}
		}
	}
	return out
}

// compareType reports what changed in type ct since et (nil: the type is
// new).
func compareType(earlier, current *Set, et, ct *Type) []Finding {
	if et == nil {
		return nil
	}
	var out []Finding
	if et.Compatibility != ct.Compatibility {
		out = append(out, Finding{Type: ct.Name, Mode: ct.Compatibility, Severity: SeverityWarning, Rule: RuleCompatibilityChanged,
			Message: fmt.Sprintf("compatibility changed from %s to %s; its versions are checked under %s", et.Compatibility, ct.Compatibility, ct.Compatibility)})
	}
	for _, ev := range et.Versions {
		cv := ct.Version(ev.Number)
		if cv == nil {
			f := Finding{Type: ct.Name, From: ev.Number, To: ev.Number, Mode: ct.Compatibility, Severity: SeverityWarning, Rule: RuleVersionRemoved,
				Message: fmt.Sprintf("version %d removed; events of it still in the outbox or on the broker can no longer be checked", ev.Number)}
			if ev.Number == et.Latest().Number {
				f.Severity, f.Rule = SeverityError, RuleLatestVersionRemoved
				f.Message = fmt.Sprintf("latest version %d removed: producers that emit the latest version would write v%d instead, and a new v%d could differ from events already written; publish a new version instead", ev.Number, ct.Latest().Number, ev.Number)
			}
			out = append(out, f)
			continue
		}
		if why := changed(earlier, current, ev, cv); why != "" {
			out = append(out, Finding{Type: ct.Name, From: ev.Number, To: ev.Number, Mode: ct.Compatibility, Severity: SeverityError, Rule: RulePublishedVersionChanged,
				Message: why + "; a published version is immutable: put the change in a new version"})
		}
	}
	return out
}

// changed says how version ev of earlier and cv of current differ,
// counting the files their $refs reach; "" when only in white space or
// key order.
func changed(earlier, current *Set, ev, cv *Version) string {
	if canonical(ev.Doc) != canonical(cv.Doc) {
		return fmt.Sprintf("%s changed since it was published", cv.Path)
	}
	seen := map[string]bool{ev.Path: true}
	queue := refFiles(ev.Path, ev.Doc)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		ed, inE := earlier.files[p]
		cd, inC := current.files[p]
		if inE != inC || canonical(ed) != canonical(cd) {
			return fmt.Sprintf("%s is unchanged, but %s, which it $refs, changed since it was published", cv.Path, p)
		}
		queue = append(queue, refFiles(p, ed)...)
	}
	return ""
}

// refFiles lists the other files doc (at path p) $refs.
func refFiles(p string, doc any) []string {
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				file, _, _ := strings.Cut(ref, "#")
				if rest, ok := strings.CutPrefix(file, baseURL); ok {
					out = append(out, path.Clean(rest))
				} else if file != "" && !strings.Contains(file, ":") {
					out = append(out, path.Clean(path.Join(path.Dir(p), file)))
				}
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(doc)
	slices.Sort(out)
	return slices.Compact(out)
}

// canonical is v as JSON with sorted keys and no white space: two
// documents that differ only in layout have the same.
func canonical(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
