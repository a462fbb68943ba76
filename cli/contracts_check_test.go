package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// layContracts writes files (path: content) under dir; "" deletes.
func layContracts(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, body := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if body == "" {
			require.NoError(t, os.Remove(full))
			continue
		}
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(body), 0o644))
	}
}

func runCheck(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Main(append([]string{"contracts", "check"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

const (
	numberTotal  = `{"type":"object","properties":{"total":{"type":"number"}}}`
	integerTotal = `{"type":"object","properties":{"total":{"type":"integer"}}}`
)

func TestContractsCheckExitCodes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	layContracts(t, dir, map[string]string{
		"order.placed/v1.schema.json": integerTotal,
		"order.placed/v2.schema.json": numberTotal,
		"contracts.json":              `{"compatibility": "BACKWARD"}`,
		"user.created/v1.schema.json": `{"type":"object"}`,
	})
	code, out, errOut := runCheck(t, "--contracts", dir)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "compatible: 3 versions of 2 types checked\n", out)
	require.Empty(t, errOut)

	layContracts(t, dir, map[string]string{"order.placed/v3.schema.json": integerTotal})
	code, out, errOut = runCheck(t, "--contracts", dir)
	require.Equal(t, 1, code, errOut)
	require.Equal(t, "order.placed v2 -> v3 (BACKWARD): /properties/total: type narrowed from number to integer [type_narrowed]\n"+
		"1 breaking change: 4 versions of 2 types checked\n", out)
	require.Empty(t, errOut)

	// FULL names the direction of each break.
	layContracts(t, dir, map[string]string{"order.placed/contract.json": `{"compatibility":"FULL"}`})
	code, out, _ = runCheck(t, "--contracts", dir)
	require.Equal(t, 1, code)
	require.Contains(t, out, "order.placed v1 -> v2 (FULL, forward): /properties/total: type widened from integer to number [type_widened]\n")
	require.Contains(t, out, "order.placed v2 -> v3 (FULL, backward): /properties/total: type narrowed from number to integer [type_narrowed]\n")
	require.Contains(t, out, "2 breaking changes: 4 versions of 2 types checked\n")

	// NONE checks nothing.
	layContracts(t, dir, map[string]string{"order.placed/contract.json": `{"compatibility":"NONE"}`})
	code, _, _ = runCheck(t, "--contracts", dir)
	require.Equal(t, 0, code)
}

func TestContractsCheckUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	layContracts(t, dir, map[string]string{"t/v1.schema.json": `{"type":"object"}`})
	bad := t.TempDir()
	layContracts(t, bad, map[string]string{"t/v1.schema.json": `{"type":`})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "needs --contracts DIR"},
		{[]string{"--contracts", filepath.Join(dir, "nope")}, "no such file or directory"},
		{[]string{"--contracts", bad}, "not valid JSON"},
		{[]string{"--contracts", dir, "--against", filepath.Join(dir, "nope")}, "--against"},
		{[]string{"--contracts", dir, "--against", dir, "--against-git", "HEAD"}, "both given"},
		{[]string{"--contracts", dir, "extra"}, "takes no arguments"},
		{[]string{"--contracts", dir, "--againts", dir}, "unknown flag: --againts"},
		// t.TempDir() is in no git work tree.
		{[]string{"--contracts", dir, "--against-git", "HEAD"}, "not in a git work tree"},
		{[]string{"--contracts", dir, "--against-git", "--upload-pack=x"}, "does not start with '-'"},
	} {
		code, out, errOut := runCheck(t, tc.args...)
		require.Equal(t, 2, code, "%v: %s%s", tc.args, out, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
		require.Empty(t, out, "%v", tc.args)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
	}
}

func TestContractsCheckJSON(t *testing.T) {
	t.Parallel()
	earlier, current := t.TempDir(), t.TempDir()
	layContracts(t, earlier, map[string]string{
		"order.placed/v1.schema.json":  numberTotal,
		"refund.issued/v1.schema.json": `{"type":"object"}`,
		"contracts.json":               `{"compatibility": "BACKWARD"}`,
	})
	layContracts(t, current, map[string]string{
		"order.placed/v1.schema.json": numberTotal,
		"order.placed/v2.schema.json": integerTotal,
		"contracts.json":              `{"compatibility": "BACKWARD"}`,
	})
	code, out, errOut := runCheck(t, "--contracts", current, "--against", earlier, "--json")
	require.Equal(t, 1, code, errOut)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Equal(t, map[string]any{
		"compatible": false,
		"contracts":  current,
		"against":    map[string]any{"kind": "dir", "ref": earlier},
		"types":      1.0,
		"versions":   2.0,
		"errors":     1.0,
		"warnings":   1.0,
		"findings": []any{
			map[string]any{"type": "order.placed", "from": 1.0, "to": 2.0, "mode": "BACKWARD", "severity": "error",
				"rule": "type_narrowed", "direction": "backward", "pointer": "/properties/total", "message": "type narrowed from number to integer"},
			map[string]any{"type": "refund.issued", "from": 0.0, "to": 0.0, "mode": "BACKWARD", "severity": "warning",
				"rule": "type_removed", "direction": "", "pointer": "", "message": "type removed (it had versions v1); its events now pass unchecked"},
		},
	}, doc)

	// Compatible: findings is an empty list, against is null.
	code, out, _ = runCheck(t, "--contracts", earlier, "--json")
	require.Equal(t, 0, code)
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Equal(t, true, doc["compatible"])
	require.Nil(t, doc["against"])
	require.Equal(t, []any{}, doc["findings"])
}

// gitRepo makes a git repository in a new directory.
func gitRepo(t *testing.T) (dir string, git func(args ...string) string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is not installed: %v", err)
	}
	dir = t.TempDir()
	git = func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"}, args...)...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	return dir, git
}

func TestContractsCheckAgainstGit(t *testing.T) {
	t.Parallel()
	repo, git := gitRepo(t)
	contractsDir := filepath.Join(repo, "svc", "contracts")
	layContracts(t, contractsDir, map[string]string{
		"order.placed/v1.schema.json": numberTotal,
		"_defs/money.schema.json":     `{"type":"integer"}`,
		"contracts.json":              `{"compatibility": "BACKWARD"}`,
		"user.created/v1.schema.json": `{"type":"object","properties":{"credit":{"$ref":"../_defs/money.schema.json"}}}`,
	})
	layContracts(t, repo, map[string]string{"README": "not a contract\n"})
	git("add", ".")
	git("commit", "-q", "-m", "v1")
	first := git("rev-parse", "HEAD")
	git("tag", "release")

	// Unchanged: compatible, from the directory or from inside it.
	code, out, errOut := runCheck(t, "--contracts", contractsDir, "--against-git", "release")
	require.Equal(t, 0, code, out+errOut)
	require.Equal(t, "compatible: 2 versions of 2 types checked against release ("+first[:12]+")\n", out)

	// A new compatible version, committed; a published one reformatted:
	// still compatible.
	layContracts(t, contractsDir, map[string]string{
		"order.placed/v1.schema.json": "{\n  \"properties\": {\"total\": {\"type\": \"number\"}},\n  \"type\": \"object\"\n}\n",
		"order.placed/v2.schema.json": numberTotal,
	})
	git("add", ".")
	git("commit", "-q", "-m", "v2")
	code, out, errOut = runCheck(t, "--contracts", contractsDir, "--against-git", "release")
	require.Equal(t, 0, code, out+errOut)

	// Uncommitted edits to a published version and to a shared file it
	// $refs are compared with the revision.
	layContracts(t, contractsDir, map[string]string{
		"order.placed/v1.schema.json": integerTotal,
		"_defs/money.schema.json":     `{"type":"integer","minimum":0}`,
	})
	code, out, errOut = runCheck(t, "--contracts", contractsDir, "--against-git", "HEAD", "--json")
	require.Equal(t, 1, code, out+errOut)
	var doc struct {
		Against  map[string]string
		Findings []struct{ Type, Rule, Message string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Equal(t, "git", doc.Against["kind"])
	require.Equal(t, "HEAD", doc.Against["ref"])
	require.Equal(t, git("rev-parse", "HEAD"), doc.Against["commit"])
	var rules []string
	for _, f := range doc.Findings {
		rules = append(rules, f.Type+" "+f.Rule)
	}
	require.Equal(t, []string{"order.placed published_version_changed", "user.created published_version_changed"}, rules)
	require.Contains(t, doc.Findings[1].Message, "_defs/money.schema.json")

	// The repository's root as the contracts directory.
	root, rgit := gitRepo(t)
	layContracts(t, root, map[string]string{"t/v1.schema.json": numberTotal})
	rgit("add", ".")
	rgit("commit", "-q", "-m", "one")
	layContracts(t, root, map[string]string{"t/v1.schema.json": ""})
	code, out, _ = runCheck(t, "--contracts", root, "--against-git", "HEAD")
	require.Equal(t, 0, code, "a warning does not fail the check: %s", out)
	require.Contains(t, out, "warning: t: type removed (it had versions v1); its events now pass unchecked [type_removed]")

	// A revision that does not exist.
	code, out, errOut = runCheck(t, "--contracts", contractsDir, "--against-git", "no-such-branch")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Contains(t, errOut, `unknown revision "no-such-branch"`)

	// A revision before the directory existed: everything is new.
	repo2, git2 := gitRepo(t)
	layContracts(t, repo2, map[string]string{"README": "x\n"})
	git2("add", ".")
	git2("commit", "-q", "-m", "empty")
	layContracts(t, repo2, map[string]string{"contracts/t/v1.schema.json": numberTotal})
	code, out, errOut = runCheck(t, "--contracts", filepath.Join(repo2, "contracts"), "--against-git", "HEAD")
	require.Equal(t, 0, code, out+errOut)
}
