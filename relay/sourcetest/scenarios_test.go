package sourcetest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every exported scenario function (t *testing.T, src Source) is in
// Scenarios under its own name, so Run, which every source's tests call,
// runs it against every source.
func TestEveryScenarioIsListed(t *testing.T) {
	t.Parallel()
	var listed []string
	for _, sc := range Scenarios {
		listed = append(listed, sc.Name)
	}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var found []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, decl := range parsed.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || !fd.Name.IsExported() || len(fd.Type.Params.List) != 2 {
				continue
			}
			if typ, ok := fd.Type.Params.List[1].Type.(*ast.Ident); ok && typ.Name == "Source" {
				found = append(found, fd.Name.Name)
			}
		}
	}
	slices.Sort(found)
	require.Contains(t, found, "Order", "the parse found no scenario")
	found = slices.DeleteFunc(found, func(name string) bool { return name == "Run" })
	sorted := slices.Sorted(slices.Values(listed))
	require.Equal(t, found, sorted, "Scenarios must list every scenario function, once, by its name")
	for _, sc := range Scenarios {
		require.NotNil(t, sc.Run, sc.Name)
	}
}
