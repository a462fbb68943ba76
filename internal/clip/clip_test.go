package clip_test

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/clip"
)

func TestText(t *testing.T) {
	require.Equal(t, "short", clip.Text("short", 5))
	require.Equal(t, "abc...", clip.Text("abcdef", 3))
	// A cut inside a multi-byte rune drops the partial rune.
	got := clip.Text("aé", 2)
	require.Equal(t, "a...", got)
	require.True(t, utf8.ValidString(got))
}

// What a row's author can put in a type, header or payload reaches an
// operator's terminal as visible escapes, never as the control characters
// that start escape sequences or fake lines.
func TestPrintableEscapesWhatATerminalActsOn(t *testing.T) {
	hostile := "order.\x1b[31mRED\a\nfake line\r\u202eevil\u0085\x7f\xff"
	got := clip.Printable(hostile)
	require.Equal(t, `order.\x1b[31mRED\a\nfake line\r\u202eevil\u0085\x7f\xff`, got)
	for _, c := range []string{"\x1b", "\a", "\n", "\r", "\u202e", "\u0085", "\x7f"} {
		require.NotContains(t, got, c)
	}
	require.True(t, utf8.ValidString(got))
	// Printable text is kept, non-ASCII letters, spaces and a real U+FFFD
	// included.
	for _, s := range []string{"order.placed", "café au lait", `a\b "q"`, "ok\uFFFD", ""} {
		require.Equal(t, s, clip.Printable(s))
	}

	// JSON text stays the same JSON: the escapes are JSON's.
	js := "{\"a\": \"\u009b31m\u2028x\U000e0001\"}"
	got = clip.PrintableJSON(js)
	require.Equal(t, `{"a": "\u009b31m\u2028x\udb40\udc01"}`, got)
	var before, after map[string]string
	require.NoError(t, json.Unmarshal([]byte(js), &before))
	require.NoError(t, json.Unmarshal([]byte(got), &after))
	require.Equal(t, before, after)
}

func TestFieldQuotesAllButPlainWords(t *testing.T) {
	require.Equal(t, "order.placed", clip.Field("order.placed"))
	require.Equal(t, `"order.\x1b[31mRED\a"`, clip.Field("order.\x1b[31mRED\a"))
	require.Equal(t, `""`, clip.Field(""))
	require.Equal(t, `"a b"`, clip.Field("a b"))
	require.Equal(t, `"a\\x1b"`, clip.Field(`a\x1b`)) // a literal backslash is not taken for an escape
	require.Equal(t, `"\xff"`, clip.Field("\xff"))
}
