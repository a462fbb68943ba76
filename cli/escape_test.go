package cli

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
)

// A row's type, headers, payload and failure are chosen by whoever can
// insert into the outbox. Every human-readable output that shows them
// (events show, retry, park, watchdog, stats, and the logs) writes the
// characters a terminal acts on as visible escapes: an escape sequence
// in a type does not recolour the operator's terminal, and a line break
// in it does not fake a line of output.
func TestHumanOutputEscapesWhatTheRowsHold(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	agg := uuid.New()
	const hostileType = "order.\x1b[31mRED\a\nfake: line"
	id := db.InsertRaw(t, agg, hostileType, `'{"note": "\u009b31m\u202eevil"}'::jsonb`, `'{"h": "\u009b2J\u2028x"}'::jsonb`)
	execSQL(t, db, `INSERT INTO {{failures}} (event_id, aggregate_id, type, reason, error, attempts, first_failed_at, failed_at, held_until)
VALUES ($1, $2, $3, $4, $5, 2, now(), now(), now() + interval '1 hour')`, id, agg, hostileType, "too_large\x1b[2J", "broker said \x1b[31mno\a")
	ids := strconv.FormatInt(id, 10)

	outputs := []struct {
		name string
		args []string
	}{
		{"events show", []string{"events", "show", ids}},
		{"events retry", []string{"events", "retry", ids}},
		{"events park", []string{"events", "park", ids, "--reason", "test"}},
		{"watchdog", []string{"watchdog"}},
		{"stats", []string{"stats"}},
		{"events show", []string{"events", "show", ids, "--payload"}},
		// Applied: the verb logs the type too, in the text log.
		{"events park", []string{"events", "park", ids, "--reason", "test", "--yes"}},
		{"events unpark", []string{"events", "unpark", ids}},
	}
	for _, o := range outputs {
		name := o.name
		_, stdout, stderr := runCLI(t, db, o.args...)
		t.Logf("outbox %s:\n%s%s", name, stdout, stderr)
		for _, out := range []string{stdout, stderr} {
			for _, c := range []string{"\x1b", "\a", "\u009b", "\u202e"} {
				require.NotContains(t, out, c, "%s: a raw %q from the table reached the output", name, c)
			}
			for _, line := range strings.Split(out, "\n") {
				require.False(t, strings.HasPrefix(line, "fake: line"), "%s: the type's line break faked a line: %q", name, line)
			}
		}
		switch name {
		case "events show", "events retry", "events park", "events unpark", "watchdog":
			require.Contains(t, stdout, `order.\x1b[31mRED\a\nfake: line`, "%s shows the type escaped", name)
		case "stats":
			require.Contains(t, stdout, `too_large\x1b[2J`, "stats shows the hold's reason escaped")
		}
	}
	_, stdout, _ := runCLI(t, db, "events", "show", ids)
	require.Contains(t, stdout, `\u009b31m\u202eevil`, "the payload is shown with JSON escapes")
	require.Contains(t, stdout, `{"h": "\u009b2J\u2028x"}`, "the headers are shown with JSON escapes")
	require.Contains(t, stdout, `broker said \x1b[31mno\a`, "the failure's error is shown escaped")
}
