package routing

import (
	"fmt"
	"strings"
)

// EscapedNATSHeaderPrefix starts the name of an event header that NATS
// could not carry as it is (see EscapeNATSHeader).
const EscapedNATSHeaderPrefix = "~"

// natsKeyForbidden are printable ASCII characters nats.go refuses in a
// header name.
const natsKeyForbidden = "\"()/,:;<=>?@[\\]{}"

// EscapeNATSHeader returns the NATS header an event header (name, value)
// travels as. NATS header names are printable ASCII without separators,
// and clients trim a value's surrounding whitespace and turn CR and LF
// into spaces, so a header that would not arrive byte for byte travels
// escaped: its name becomes "~" followed by the name percent-encoded, its
// value percent-encoded (every byte outside '!'..'~', '%', and the
// characters names forbid, as %XX). Names starting with "~" are escaped
// too, so that an escaped name is never ambiguous, and so are names
// starting with "Nats-" in any case, which the server would act upon
// (Nats-Msg-Id, Nats-Expected-Stream, ...). Any other header travels as
// it is. UnescapeNATSHeader reverses it.
func EscapeNATSHeader(name, value string) (string, string) {
	if natsVerbatim(name, value) {
		return name, value
	}
	return EscapedNATSHeaderPrefix + percentEncode(name), percentEncode(value)
}

// UnescapeNATSHeader returns the event header a NATS header (name, value)
// carries: EscapeNATSHeader's input for its output.
func UnescapeNATSHeader(name, value string) (string, string, error) {
	rest, ok := strings.CutPrefix(name, EscapedNATSHeaderPrefix)
	if !ok {
		return name, value, nil
	}
	n, err := percentDecode(rest)
	if err != nil {
		return "", "", fmt.Errorf("escaped NATS header name %q: %w", name, err)
	}
	v, err := percentDecode(value)
	if err != nil {
		return "", "", fmt.Errorf("value of escaped NATS header %q: %w", name, err)
	}
	return n, v, nil
}

func natsVerbatim(name, value string) bool {
	if name == "" || strings.HasPrefix(name, EscapedNATSHeaderPrefix) || len(name) >= 5 && strings.EqualFold(name[:5], "nats-") {
		return false
	}
	for i := 0; i < len(name); i++ {
		if b := name[i]; b < '!' || b > '~' || strings.IndexByte(natsKeyForbidden, b) >= 0 {
			return false
		}
	}
	if strings.ContainsAny(value, "\r\n") {
		return false
	}
	return strings.Trim(value, " \t") == value
}

func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '!' || c > '~' || c == '%' || strings.IndexByte(natsKeyForbidden, c) >= 0 {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func percentDecode(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("truncated escape at byte %d", i)
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("bad escape %q at byte %d", s[i:i+3], i)
		}
		b.WriteByte(hi<<4 | lo)
		i += 2
	}
	return b.String(), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
