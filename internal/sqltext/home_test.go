package sqltext_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/sqltext"
)

// Each package's statements live in its sql.go, and every one is
// registered, so the plan test sees it: a constant named ...SQL declared
// anywhere else, or left out of Register, fails here.
func TestStatementsLiveInSQLGoAndAreRegistered(t *testing.T) {
	t.Parallel()
	registered := map[string]bool{}
	for _, st := range sqltext.Registered() {
		registered[st.Name] = true
	}
	for dir, pkg := range map[string]string{"../..": "outbox", "../../relay": "relay", "../../ops": "ops", "../../ops/switchover": "switchover", "../cleanuplock": "cleanuplock", "../partition": "partition", "../../consumer": "consumer", "../../migrate": "migrate"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			for _, decl := range parsed.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, spec := range gd.Specs {
					for _, name := range spec.(*ast.ValueSpec).Names {
						if !strings.HasSuffix(name.Name, "SQL") {
							continue
						}
						require.Equal(t, "sql.go", filepath.Base(f), "%s.%s is a statement: declare it in %s", pkg, name.Name, filepath.Join(dir, "sql.go"))
						require.True(t, registered[pkg+"."+name.Name], "%s.%s is not registered (sqltext.Register in %s)", pkg, name.Name, f)
					}
				}
			}
		}
	}
}
