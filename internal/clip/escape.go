package clip

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Printable returns s with every character a terminal could act on
// written as a Go escape: control characters (\n, \a, \x1b: an escape
// sequence starts with one), DEL, the C1 controls, invisible format
// characters such as the bidirectional overrides (\u202e), the line and
// paragraph separators, and bytes that are not UTF-8 (\xff). Everything
// printable, spaces included, is kept as it is. Text read from the outbox
// is untrusted: whoever can insert a row chooses its type, headers and
// payload, and without this an operator's terminal would run the escape
// sequences they hold, or show lines they fake.
func Printable(s string) string {
	return escape(s, false)
}

// PrintableJSON is Printable for JSON text (a payload, a headers object):
// the characters Printable escapes are written as JSON escapes (\u001b),
// so the text stays the same JSON. Bytes that are not UTF-8, which JSON
// cannot escape, are written as \x escapes.
func PrintableJSON(s string) string {
	return escape(s, true)
}

// Field is s for one column or value of a line: s itself when it is one
// plain word, else s quoted as a Go string, with quotes, backslashes and
// everything Printable escapes escaped, so that an empty value, a value
// with spaces or with characters that look like an escape is seen for
// what it is.
func Field(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == '"' || r == '\\' || unsafe(r) }) ||
		!utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	return s
}

// unsafe reports whether a terminal could act on r or show it as nothing:
// what Printable escapes.
func unsafe(r rune) bool {
	return r != ' ' && !unicode.IsPrint(r)
}

func escape(s string, asJSON bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unsafe(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !unsafe(r):
			b.WriteString(s[i : i+n])
		case asJSON:
			units := []rune{r}
			if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
				units = []rune{r1, r2} // above U+FFFF: a surrogate pair
			}
			for _, u := range units {
				fmt.Fprintf(&b, `\u%04x`, u)
			}
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\a', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}
