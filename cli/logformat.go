package cli

import (
	"fmt"
	"log/slog"
	"strings"
)

// durationStrings is the JSON logs' ReplaceAttr: slog's JSON handler
// writes a time.Duration as integer nanoseconds (1500000000); people and
// log pipelines read "1.5s", the form the flags take and the text logs use.
func durationStrings(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// readableText is the text logs' ReplaceAttr. slog quotes a value that
// holds a space or a double quote and escapes the quotes inside, so a
// Postgres error reads err="relation \"public\".\"events_outbox\" does not
// exist". Text logs are for people: double quotes inside a value become
// single quotes and line breaks become spaces, so the value needs no
// escapes (err="relation 'public'.'events_outbox' does not exist"). The
// JSON logs keep every value exactly.
func readableText(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey) {
		return a
	}
	var s string
	switch v := a.Value; v.Kind() {
	case slog.KindString:
		s = v.String()
	case slog.KindDuration:
		return slog.String(a.Key, v.Duration().String())
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			s = x.Error()
		case fmt.Stringer:
			s = x.String()
		default:
			return a
		}
	default:
		return a
	}
	if !strings.ContainsAny(s, "\"\n\r\t") {
		if a.Value.Kind() == slog.KindString {
			return a
		}
		return slog.String(a.Key, s)
	}
	s = strings.ReplaceAll(s, `"`, "'")
	if strings.ContainsAny(s, "\n\r\t") {
		s = strings.Join(strings.Fields(s), " ")
	}
	return slog.String(a.Key, s)
}
