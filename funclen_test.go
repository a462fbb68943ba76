package outbox_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Function length limits, counted from the func keyword to the closing
// brace, in non-test files: none over funcLenMax anywhere, none over
// funcLenMaxOutsideBench outside internal/bench/, the load tool.
const (
	funcLenMax             = 150
	funcLenMaxOutsideBench = 80
)

// funcLenKnown lists the functions over the limit today, with their length
// in lines. The list may only shrink: a function over the limit that is not
// here fails the test, and so does an entry whose function is now within
// the limit, longer than listed, or gone. Shorten a function and drop (or
// lower) its entry in the same change.
var funcLenKnown = map[string]int{}

// Every function of the module stays within the length limits, but for the
// known offenders, which may only shrink and leave the list once within
// the limit.
func TestFunctionLengths(t *testing.T) {
	t.Parallel()
	got, err := longFunctions(".")
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	for name, n := range got {
		want, known := funcLenKnown[name]
		switch {
		case !known:
			problems = append(problems, fmt.Sprintf("%s is %d lines, over the limit of %d: split it", name, n, funcLenLimit(name)))
		case n > want:
			problems = append(problems, fmt.Sprintf("%s is %d lines, longer than the %d funcLenKnown allows: split it", name, n, want))
		case n < want:
			t.Logf("%s is %d lines now: its funcLenKnown entry (%d) may be lowered", name, n, want)
		}
	}
	for name, want := range funcLenKnown {
		if _, ok := got[name]; !ok {
			problems = append(problems, fmt.Sprintf("%s (listed at %d lines) is within the limit or gone: drop its funcLenKnown entry", name, want))
		}
		if strings.HasPrefix(name, "relay/walrelay/") {
			problems = append(problems, fmt.Sprintf("%s: relay/walrelay has no exemption", name))
		}
	}
	slices.Sort(problems)
	for _, p := range problems {
		t.Error(p)
	}
}

// longFunctions returns the functions of the non-test .go files under root
// that are over their limit, as "path:name" (path relative to root, with
// forward slashes; methods named "(*T).m" or "(T).m") mapped to their
// length in lines.
func longFunctions(root string) (map[string]int, error) {
	out := map[string]int{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// Hidden and testdata directories are no part of the build;
			// a nested module (its own go.mod) is not this module.
			if path != root && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || d.Name() == "testdata" || d.Name() == "vendor" || fileExists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(path)
		limit := funcLenLimit(rel)
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if n > limit {
				out[rel+":"+funcName(fn)] = n
			}
		}
		return nil
	})
	return out, err
}

// funcLenLimit is the most lines a function of the file (or "file:name")
// may have.
func funcLenLimit(path string) int {
	if strings.HasPrefix(path, "internal/bench/") {
		return funcLenMax
	}
	return funcLenMaxOutsideBench
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	return "(" + recvType(fn.Recv.List[0].Type) + ")." + fn.Name.Name
}

func recvType(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return "*" + recvType(e.X)
	case *ast.IndexExpr: // T[P]
		return recvType(e.X)
	case *ast.IndexListExpr: // T[P, Q]
		return recvType(e.X)
	case *ast.Ident:
		return e.Name
	}
	return fmt.Sprintf("%T", e)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
