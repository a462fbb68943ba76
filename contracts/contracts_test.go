package contracts_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/contracts"
)

// writeDir lays out files (path: content) in a new directory.
func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, body := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(body), 0o644))
	}
	return dir
}

const orderV1 = `{"type":"object","required":["order_id","total_cents"],
 "properties":{"order_id":{"type":"string"},"total_cents":{"type":"integer","minimum":0}}}`

func TestCheckNamesPointerAndRule(t *testing.T) {
	t.Parallel()
	dir := writeDir(t, map[string]string{
		"order.placed/v1.schema.json": orderV1,
		"order.placed/v2.schema.json": `{"type":"object","required":["order_id","total_cents","currency"],
 "properties":{"order_id":{"type":"string"},"total_cents":{"type":"integer"},"currency":{"$ref":"../_defs/currency.json"}}}`,
		"_defs/currency.json": `{"type":"string","enum":["EUR","USD"]}`,
	})
	set, err := contracts.Load(dir)
	require.NoError(t, err)
	typ := set.Type("order.placed")
	require.NotNil(t, typ)
	require.Equal(t, contracts.ForwardTransitive, typ.Compatibility, "the default mode")
	require.Len(t, typ.Versions, 2)
	require.Nil(t, set.Type("_defs"), "a folder starting with _ is not a type")

	v, err := set.Check("order.placed", 1, []byte(`{"order_id":"a","total_cents":10}`))
	require.NoError(t, err)
	require.Equal(t, 1, v)

	// Version 0 is the latest; a wrong enum in a $ref'd file is reported
	// at its place in the payload.
	v, err = set.Check("order.placed", 0, []byte(`{"order_id":"a","total_cents":10,"currency":"GBP"}`))
	var viol *contracts.Violation
	require.ErrorAs(t, err, &viol)
	require.Equal(t, 2, v)
	require.Equal(t, "/currency", viol.Pointer)
	require.Contains(t, viol.Rule, "enum")

	_, err = set.Check("order.placed", 1, []byte(`{"order_id":"a","total_cents":"10"}`))
	require.ErrorAs(t, err, &viol)
	require.Equal(t, "/total_cents", viol.Pointer)
	require.Equal(t, "/properties/total_cents/type", viol.Rule)
	require.Contains(t, err.Error(), "order.placed v1: at /total_cents")

	_, err = set.Check("order.placed", 1, []byte(`{"order_id":"a"}`))
	require.ErrorAs(t, err, &viol)
	require.Equal(t, "", viol.Pointer)
	require.Equal(t, "/required", viol.Rule)

	_, err = set.Check("order.placed", 3, []byte(`{}`))
	require.ErrorIs(t, err, contracts.ErrUnknownVersion)
	require.Contains(t, err.Error(), "v1, v2")

	v, err = set.Check("order.shipped", 0, []byte(`{}`))
	require.NoError(t, err, "a type without a contract passes unless the set requires one")
	require.Zero(t, v)
}

func TestRequireAndSettings(t *testing.T) {
	t.Parallel()
	dir := writeDir(t, map[string]string{
		"contracts.json":              `{"require": true, "compatibility": "FULL"}`,
		"order.placed/v1.schema.json": orderV1,
		"order.paid/contract.json":    `{"compatibility": "FORWARD_TRANSITIVE"}`,
		"order.paid/v3.schema.json":   `{"type":"object"}`,
	})
	set, err := contracts.Load(dir)
	require.NoError(t, err)
	require.True(t, set.Require)
	require.Equal(t, contracts.Full, set.Type("order.placed").Compatibility)
	require.Equal(t, contracts.ForwardTransitive, set.Type("order.paid").Compatibility)
	require.Equal(t, 3, set.Type("order.paid").Latest().Number)
	_, err = set.Check("order.cancelled", 0, []byte(`{}`))
	require.ErrorIs(t, err, contracts.ErrNoContract)
}

func TestLoadRefusesBadDirectories(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		files map[string]string
		want  string
	}{
		"bad JSON":         {map[string]string{"a/v1.schema.json": `{`}, "not valid JSON"},
		"bad schema":       {map[string]string{"a/v1.schema.json": `{"type": 12}`}, "a/v1.schema.json"},
		"remote ref":       {map[string]string{"a/v1.schema.json": `{"$ref": "https://example.com/x.json"}`}, "outside the contracts directory"},
		"bad mode":         {map[string]string{"a/contract.json": `{"compatibility":"SIDEWAYS"}`, "a/v1.schema.json": `{}`}, "use one of NONE, BACKWARD"},
		"unknown key":      {map[string]string{"contracts.json": `{"requried": true}`}, "unknown field"},
		"require per type": {map[string]string{"a/contract.json": `{"require": true}`, "a/v1.schema.json": `{}`}, "only contracts.json"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := contracts.Load(writeDir(t, tc.files))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := contracts.Load(filepath.Join(t.TempDir(), "missing"))
	require.Error(t, err)
	require.Contains(t, err.Error(), "--contracts names the directory")
	require.False(t, errors.Is(err, contracts.ErrNoContract))
}

func TestVersionFileNames(t *testing.T) {
	t.Parallel()
	dir := writeDir(t, map[string]string{
		"a/v1.schema.json":  `{}`,
		"a/v01.schema.json": `{}`, // not a version: leading zero
		"a/v2.json":         `{}`, // not a version: no .schema
		"a/notes.json":      `{}`,
	})
	set, err := contracts.Load(dir)
	require.NoError(t, err)
	require.Len(t, set.Type("a").Versions, 1)
}
