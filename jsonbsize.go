package outbox

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"
)

// The relayer publishes a payload as Postgres prints it (payload::text), not
// as the caller wrote it: JSONB drops whitespace, writes ": " and ", "
// between members and elements, keeps only the last of duplicate keys,
// re-escapes strings and prints numbers as numeric does, so "1e3" becomes
// "1000" and a compact [0,0,0] grows by half. JSONB also refuses a few
// things encoding/json accepts. This file measures that text and finds those
// refusals without a round trip, so Emit can refuse an event that could
// never be published before any SQL runs.

// Postgres numeric's limits (numeric.c): the weight of the first base-10000
// digit is an int16 and the display scale at most 0x3FFF, so at most
// 131072 digits before the decimal point and 16383 after; numeric_in
// refuses an exponent of INT_MAX/2 or more in either direction before
// looking at the digits.
const (
	numericMaxIntDigits = 131072
	numericMaxScale     = 16383
	numericMaxExponent  = 1<<30 - 1 // INT_MAX/2
)

// jsonbTextLen returns the length in bytes of Postgres' JSONB text of raw
// (`raw::jsonb::text`), or an error saying what JSONB would refuse in it.
// raw must be valid JSON (json.Valid).
func jsonbTextLen(raw []byte) (int, error) {
	n, multiKey, err := jsonbScan(raw)
	if err != nil || !multiKey {
		return n, err
	}
	return jsonbExactLen(raw), nil
}

// jsonbScan checks raw (valid JSON) for what JSONB refuses and returns the
// length of its JSONB text, counting every object member. JSONB keeps only
// the last member of a repeated key, so when multiKey is set (some object
// has more than one member) n is an upper bound, which jsonbExactLen
// refines. The scan is linear and allocates nothing: without duplicates
// the text's length is the sum of its tokens' lengths.
func jsonbScan(raw []byte) (n int, multiKey bool, err error) {
	if !utf8.Valid(raw) {
		return 0, false, invalidUTF8(raw)
	}
	// A key after a comma is an object's second member or later.
	comma, keyAfterComma := false, false
	for i := 0; i < len(raw); {
		switch raw[i] {
		case ' ', '\t', '\n', '\r':
			i++
			continue
		case '{', '}', '[', ']':
			n++
			i++
		case ',':
			n += 2
			i++
			comma = true
			continue
		case ':':
			n += 2
			i++
			multiKey = multiKey || keyAfterComma
		case 't', 'n':
			n += 4
			i += 4
		case 'f':
			n += 5
			i += 5
		case '"':
			keyAfterComma = comma
			var sn int
			if i, sn, err = jsonbString(raw, i, nil); err != nil {
				return 0, false, err
			}
			n += sn
		default:
			var nn int
			if i, nn, err = jsonbNumber(raw, i); err != nil {
				return 0, false, err
			}
			n += nn
		}
		comma = false
	}
	return n, multiKey, nil
}

// jsonbString measures the string starting at raw[i] == '"' as JSONB prints
// it: decoded, then `"` and `\` escaped, \b \f \n \r \t as two-character
// escapes, other control characters as \u00XX and everything else raw. It
// returns the index after the closing quote and the length, quotes
// included. With key non-nil it also appends the decoded string to *key.
func jsonbString(raw []byte, i int, key *[]byte) (end, n int, err error) {
	i++
	n = 2
	quote := -1 // the next '"' at or after i, which may be an escaped one
	for {
		// Runs of plain bytes are mostly short, where a loop beats
		// IndexByte's setup; a long one is searched with IndexByte, the
		// quote remembered so a long string with many escapes stays linear.
		next := i
		for lim := min(len(raw), i+16); next < lim && raw[next] != '"' && raw[next] != '\\'; next++ {
		}
		if next == i+16 && next < len(raw) {
			if quote < next {
				if quote = bytes.IndexByte(raw[next:], '"'); quote < 0 {
					quote = len(raw) // not valid JSON
				} else {
					quote += next
				}
			}
			if bs := bytes.IndexByte(raw[next:quote], '\\'); bs >= 0 {
				next += bs
			} else {
				next = quote
			}
		}
		n += next - i
		if key != nil {
			*key = append(*key, raw[i:next]...)
		}
		i = next
		if i+1 >= len(raw) || raw[i] == '"' { // the closing quote, or (not valid JSON) the end
			return i + 1, n, nil
		}
		var r rune
		size := 2
		switch raw[i+1] {
		case 'u':
			if r, size, err = jsonbEscape(raw, i); err != nil {
				return 0, 0, err
			}
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		default: // " \ /
			r = rune(raw[i+1])
		}
		i += size
		n += escapedLen(r)
		if key != nil {
			*key = utf8.AppendRune(*key, r)
		}
	}
}

// escapedLen is the length of r in JSONB's text of a string.
func escapedLen(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return 6 // \u00XX
	}
	return utf8.RuneLen(r)
}

// jsonbEscape decodes the \uXXXX escape at raw[i] (and the low surrogate
// that must follow a high one), returning the rune and the escape's length,
// or why JSONB refuses it.
func jsonbEscape(raw []byte, i int) (rune, int, error) {
	cp := hex4(raw, i+2)
	switch {
	case cp == 0:
		return 0, 0, fmt.Errorf("the escape \\u0000 at byte %d is a NUL character, which Postgres JSONB cannot store; drop it from the string", i)
	case cp >= 0xdc00 && cp <= 0xdfff:
		return 0, 0, fmt.Errorf("the escape %s at byte %d is a UTF-16 low surrogate without a high surrogate before it, which Postgres JSONB refuses; escape the whole pair, or write the character as UTF-8", raw[i:i+6], i)
	case cp >= 0xd800 && cp <= 0xdbff:
		lo := -1
		if i+11 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
			lo = hex4(raw, i+8)
		}
		if lo < 0xdc00 || lo > 0xdfff {
			return 0, 0, fmt.Errorf("the escape %s at byte %d is a UTF-16 high surrogate not followed by a low surrogate escape, which Postgres JSONB refuses; escape the whole pair, or write the character as UTF-8", raw[i:i+6], i)
		}
		return 0x10000 + rune(cp-0xd800)<<10 + rune(lo-0xdc00), 12, nil
	case cp < 0:
		return 0, 0, fmt.Errorf("the escape at byte %d is not \\u and four hex digits", i) // not valid JSON
	}
	return rune(cp), 6, nil
}

// hex4 decodes four hex digits at raw[i:], or returns -1.
func hex4(raw []byte, i int) int {
	if i+4 > len(raw) {
		return -1
	}
	v := 0
	for _, c := range raw[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		v = v<<4 | int(c)
	}
	return v
}

// jsonbNumber measures the number at raw[i] as Postgres numeric prints it:
// the exponent applied, the scale max(0, fraction digits - exponent), no
// sign on zero. It returns the index after the number and the length, or
// why numeric refuses it.
func jsonbNumber(raw []byte, i int) (end, n int, err error) {
	start := i
	neg := raw[i] == '-'
	if neg {
		i++
	}
	intStart := i
	for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
		i++
	}
	intLen := i - intStart
	// p is the decimal position of the first non-zero digit (0 for units,
	// -1 for tenths). JSON allows no leading zeros, so the integer part is
	// either 0 or starts with its first non-zero digit.
	nonzero := intLen > 0 && raw[intStart] != '0'
	p := int64(intLen - 1)
	fracLen := 0
	if i < len(raw) && raw[i] == '.' {
		i++
		fracStart := i
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			if !nonzero && raw[i] != '0' {
				nonzero = true
				p = int64(fracStart - i - 1)
			}
			i++
		}
		fracLen = i - fracStart
	}
	var exp int64
	if i < len(raw) && (raw[i] == 'e' || raw[i] == 'E') {
		i++
		expNeg := false
		if i < len(raw) && (raw[i] == '+' || raw[i] == '-') {
			expNeg = raw[i] == '-'
			i++
		}
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			if exp <= numericMaxExponent {
				exp = exp*10 + int64(raw[i]-'0')
			}
			i++
		}
		if exp >= numericMaxExponent {
			return 0, 0, numberErr(raw[start:i], start, "its exponent is beyond what Postgres numeric accepts")
		}
		if expNeg {
			exp = -exp
		}
	}
	scale := max(int64(fracLen)-exp, 0)
	if scale > numericMaxScale {
		return 0, 0, numberErr(raw[start:i], start, fmt.Sprintf("it has %d digits after the decimal point; Postgres numeric allows %d", scale, numericMaxScale))
	}
	n = 1 // "0" when the integer part is zero
	if nonzero {
		p += exp
		if p >= numericMaxIntDigits {
			return 0, 0, numberErr(raw[start:i], start, fmt.Sprintf("it has %d digits before the decimal point; Postgres numeric allows %d", p+1, numericMaxIntDigits))
		}
		if p > 0 {
			n = int(p) + 1
		}
		if neg {
			n++
		}
	}
	if scale > 0 {
		n += 1 + int(scale)
	}
	return i, n, nil
}

func numberErr(num []byte, at int, why string) error {
	s := string(num)
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return fmt.Errorf("the number %s at byte %d does not fit Postgres numeric: %s; send it as a string", s, at, why)
}

func invalidUTF8(raw []byte) error {
	at := 0
	for at < len(raw) {
		r, size := utf8.DecodeRune(raw[at:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		at += size
	}
	return fmt.Errorf("byte %d (%#02x) is not valid UTF-8, which Postgres cannot store; encode the text as UTF-8", at, raw[at])
}

// jsonbExactLen is the length of raw's JSONB text with repeated keys
// counted once, for the last value: the slow path behind jsonbScan, which
// must have accepted raw.
func jsonbExactLen(raw []byte) int {
	var keys [512]byte
	var members [32]jsonbMember
	w := jsonbWalk{raw: raw, keys: keys[:0], members: members[:0]}
	return w.value()
}

type jsonbWalk struct {
	raw []byte
	i   int
	// keys holds the decoded keys of the objects open on the walk's stack
	// and members their members, as a stack: an object truncates both back
	// when it closes.
	keys    []byte
	members []jsonbMember
	sorted  []jsonbMember // scratch for a large object's members
}

// jsonbMember is one object member: its key (keys[off:end]), the length
// of `"key": value`, and its position in the object.
type jsonbMember struct {
	off, end, n, pos int
}

func (w *jsonbWalk) skipSpace() {
	for w.i < len(w.raw) {
		switch w.raw[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

func (w *jsonbWalk) value() int {
	w.skipSpace()
	var n int
	switch w.raw[w.i] {
	case '{':
		return w.object()
	case '[':
		w.i++
		w.skipSpace()
		n = 2
		if w.raw[w.i] == ']' {
			w.i++
			return n
		}
		for {
			n += w.value()
			w.skipSpace()
			w.i++ // ',' or ']'
			if w.raw[w.i-1] == ']' {
				return n
			}
			n += 2
		}
	case 't', 'n':
		w.i += 4
		return 4
	case 'f':
		w.i += 5
		return 5
	case '"':
		w.i, n, _ = jsonbString(w.raw, w.i, nil)
	default:
		w.i, n, _ = jsonbNumber(w.raw, w.i)
	}
	return n
}

func (w *jsonbWalk) object() int {
	w.i++
	w.skipSpace()
	if w.raw[w.i] == '}' {
		w.i++
		return 2
	}
	base, keysBase := len(w.members), len(w.keys)
	for {
		w.skipSpace()
		off := len(w.keys)
		var kn int
		w.i, kn, _ = jsonbString(w.raw, w.i, &w.keys)
		end := len(w.keys)
		w.skipSpace()
		w.i++ // ':'
		vn := w.value()
		w.members = append(w.members, jsonbMember{off: off, end: end, n: kn + 2 + vn, pos: len(w.members) - base})
		w.skipSpace()
		w.i++ // ',' or '}'
		if w.raw[w.i-1] == '}' {
			break
		}
	}
	// JSONB keeps the last member of each key; the order it sorts them in
	// does not change the length.
	ms := w.members[base:]
	n, kept := 2, 0
	if len(ms) <= 16 {
		for j, m := range ms {
			if !w.repeatedLater(m, ms[j+1:]) {
				n += m.n
				kept++
			}
		}
	} else {
		// Sorted by key, then by position, the member JSONB keeps is the
		// last of each run.
		w.sorted = append(w.sorted[:0], ms...)
		slices.SortFunc(w.sorted, func(a, b jsonbMember) int {
			if c := bytes.Compare(w.key(a), w.key(b)); c != 0 {
				return c
			}
			return a.pos - b.pos
		})
		for j, m := range w.sorted {
			if j+1 < len(w.sorted) && bytes.Equal(w.key(m), w.key(w.sorted[j+1])) {
				continue
			}
			n += m.n
			kept++
		}
	}
	n += 2 * (kept - 1)
	w.members, w.keys = w.members[:base], w.keys[:keysBase]
	return n
}

func (w *jsonbWalk) key(m jsonbMember) []byte { return w.keys[m.off:m.end] }

// repeatedLater reports whether m's key appears again in later.
func (w *jsonbWalk) repeatedLater(m jsonbMember, later []jsonbMember) bool {
	key := w.key(m)
	for _, l := range later {
		if l.end-l.off == len(key) && bytes.Equal(w.key(l), key) {
			return true
		}
	}
	return false
}

// quoteShort quotes s for an error message, cut to a readable length.
func quoteShort(s string) string {
	const max = 64
	if len(s) <= max {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:max]) + fmt.Sprintf("... (%d bytes)", len(s))
}
