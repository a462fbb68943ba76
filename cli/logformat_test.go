package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// JSON logs give durations as Go duration strings, not nanoseconds; text
// logs show error messages with quotes in them without backslashes.
func TestLogFormatsAreReadable(t *testing.T) {
	t.Parallel()
	pgErr := errors.New(`claim: ERROR: relation "ba.events_outbox" does not exist (SQLSTATE 42P01)`)
	logWith := func(format string) string {
		var buf bytes.Buffer
		g := &globals{stderr: &buf, logLevel: "info", logFormat: format}
		log, err := g.logger()
		require.NoError(t, err)
		log.Info(`relay "started"`, "outbox", `"public"."events_outbox"`, "poll_interval", time.Second,
			"retry_in", 1500*time.Millisecond, "batch_size", 5000, "err", pgErr, "note", "two\nlines")
		log.WithGroup("cleanup").Info("done", "took", 4*time.Millisecond)
		return buf.String()
	}

	lines := strings.Split(strings.TrimSpace(logWith("json")), "\n")
	require.Len(t, lines, 2)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &rec))
	require.Equal(t, "1s", rec["poll_interval"])
	require.Equal(t, "1.5s", rec["retry_in"])
	require.Equal(t, float64(5000), rec["batch_size"], "numbers stay numbers")
	require.Equal(t, pgErr.Error(), rec["err"], "JSON keeps values exactly")
	require.Equal(t, `relay "started"`, rec["msg"])
	require.Contains(t, lines[1], `"cleanup":{"took":"4ms"}`)

	text := logWith("text")
	require.NotContains(t, text, `\"`, "no escaped quotes: %s", text)
	require.NotContains(t, text, `\n`)
	require.Contains(t, text, `msg="relay 'started'" outbox='public'.'events_outbox' poll_interval=1s retry_in=1.5s batch_size=5000 err="claim: ERROR: relation 'ba.events_outbox' does not exist (SQLSTATE 42P01)" note="two lines"`)
	require.Contains(t, text, "cleanup.took=4ms")
}
