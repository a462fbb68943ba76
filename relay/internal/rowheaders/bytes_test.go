package rowheaders

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// headerBytes reads what encoding/json reads, escapes and all, and keeps
// the bytes that are not UTF-8, which encoding/json replaces.
func TestHeaderBytesReadsWhatJSONReadsAndKeepsBytes(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		`{}`, ` { } `, `{"a": "b"}`, "{\n\t\"a\" : \"b\" ,\r\n \"c\":\"\"}",
		`{"q": "\"\\\/\b\f\n\r\t"}`, `{"u": "\u00e9\u20ac\ud83d\ude00"}`, `{"lone": "\ud83d x"}`, `{"lone2": "\ude00"}`,
		`{"dup": "1", "dup": "2"}`, `{"é": "ü"}`,
	} {
		var want map[string]string
		require.NoError(t, json.Unmarshal([]byte(raw), &want), raw)
		got, err := headerBytes([]byte(raw))
		require.NoError(t, err, raw)
		require.Equal(t, want, got, raw)
	}
	got, err := headerBytes([]byte("{\"k\xe9y\": \"caf\xe9 \\\"\xff\\\"\"}"))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"k\xe9y": "caf\xe9 \"\xff\""}, got)
	for _, bad := range []string{``, `[]`, `{"a"}`, `{"a": 1}`, `{"a": "b"`, `{"a": "\x"}`, `{"a": "\u12"}`} {
		_, err := headerBytes([]byte(bad))
		require.Error(t, err, bad)
	}
}
