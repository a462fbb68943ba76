package rowheaders

import (
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// headerBytes reads raw, a JSON object whose values are strings (checked
// by encoding/json first), keeping every byte of its names and values
// as it is. encoding/json writes U+FFFD for bytes that are not UTF-8; a
// SQL_ASCII database stores and returns such bytes unchanged, and
// Kafka headers carry bytes, so the relayer publishes them as stored.
func headerBytes(raw []byte) (map[string]string, error) {
	p := byteScanner{b: raw}
	p.space()
	if !p.take('{') {
		return nil, p.fail()
	}
	out := map[string]string{}
	p.space()
	if p.take('}') {
		return out, nil
	}
	for {
		p.space()
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		p.space()
		if !p.take(':') {
			return nil, p.fail()
		}
		p.space()
		v, err := p.str()
		if err != nil {
			return nil, err
		}
		out[k] = v // a later duplicate wins, as with encoding/json
		p.space()
		if p.take(',') {
			continue
		}
		if p.take('}') {
			return out, nil
		}
		return nil, p.fail()
	}
}

type byteScanner struct {
	b []byte
	i int
}

func (p *byteScanner) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

func (p *byteScanner) take(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *byteScanner) fail() error {
	return errors.New("unexpected input at byte " + strconv.Itoa(p.i))
}

// str reads one JSON string, its escapes decoded and every other byte
// kept.
func (p *byteScanner) str() (string, error) {
	if !p.take('"') {
		return "", p.fail()
	}
	var s []byte
	for p.i < len(p.b) {
		c := p.b[p.i]
		p.i++
		switch c {
		case '"':
			return string(s), nil
		case '\\':
			if p.i >= len(p.b) {
				return "", p.fail()
			}
			e := p.b[p.i]
			p.i++
			switch e {
			case '"', '\\', '/':
				s = append(s, e)
			case 'b':
				s = append(s, '\b')
			case 'f':
				s = append(s, '\f')
			case 'n':
				s = append(s, '\n')
			case 'r':
				s = append(s, '\r')
			case 't':
				s = append(s, '\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return "", p.fail()
				}
				if utf16.IsSurrogate(r) {
					// A pair; a lone half is U+FFFD, as encoding/json has it.
					save := p.i
					if p.take('\\') && p.take('u') {
						if r2, ok := p.hex4(); ok {
							if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
								s = utf8.AppendRune(s, d)
								continue
							}
						}
					}
					p.i = save
					r = utf8.RuneError
				}
				s = utf8.AppendRune(s, r)
			default:
				return "", p.fail()
			}
		default:
			s = append(s, c)
		}
	}
	return "", p.fail()
}

func (p *byteScanner) hex4() (rune, bool) {
	if p.i+4 > len(p.b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(p.b[p.i:p.i+4]), 16, 16)
	if err != nil {
		return 0, false
	}
	p.i += 4
	return rune(n), true
}
