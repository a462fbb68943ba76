package clip_test

import (
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
