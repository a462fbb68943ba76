// Package npmtest runs npm packages that tests check the project
// against (the Standard Webhooks library, the CloudEvents SDK, the
// AsyncAPI parser): clients that no one here wrote.
package npmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Install writes files (name: content; a package.json and the scripts)
// into a directory of the test's own, runs npm install there and returns
// the directory and the node binary. Without node or npm the test fails
// under CI=true (.ci/run installs them) and is skipped otherwise; what
// names the check that then goes undone.
func Install(t testing.TB, files map[string][]byte, what string) (dir, node string) {
	t.Helper()
	npm, err := exec.LookPath("npm")
	node, err2 := exec.LookPath("node")
	if err != nil || err2 != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node and npm are needed for %s (.ci/run installs them)", what)
		}
		t.Skipf("node or npm not on PATH: %s is not checked", what)
	}
	dir = t.TempDir()
	for name, b := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o600))
	}
	install := exec.Command(npm, "install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error")
	install.Dir = dir
	out, err := install.CombinedOutput()
	require.NoError(t, err, "npm install for %s: %s", what, out)
	return dir, node
}

// Files reads names from dir (a testdata folder), for Install.
func Files(t testing.TB, dir string, names ...string) map[string][]byte {
	t.Helper()
	files := make(map[string][]byte, len(names))
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		files[n] = b
	}
	return files
}
