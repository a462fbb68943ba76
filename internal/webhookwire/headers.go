package webhookwire

import (
	"fmt"
	"strconv"
	"strings"
)

// An event's own headers travel as HTTP headers. HTTP header names are
// case-insensitive tokens and values lose their edge spaces and may not
// hold control bytes, so both are percent-encoded where HTTP could not
// carry them as they are, and decoded back byte for byte:
//
//   - a name keeps its lowercase letters, digits and the token
//     punctuation !#$&'*+-.^_`|~; every other byte (an uppercase letter,
//     a space, '%', non-ASCII) becomes %XX: "traceparent" stays,
//     "X-Foo" becomes "%58-%46oo".
//   - a value keeps visible ASCII and inner spaces; '%', control bytes,
//     non-ASCII bytes and a space at either end become %XX: "a b" stays,
//     "Grüße" becomes "Gr%C3%BC%C3%9Fe".
//
// Both decode with any percent-decoder that leaves '+' alone (Go's
// url.PathUnescape, JavaScript's decodeURIComponent).

func nameByteOK(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$&'*+-.^_`|~", c) >= 0
}

// EncodeName is an event header's name as an HTTP header name.
func EncodeName(name string) string {
	return encode(name, func(i int, c byte) bool { return nameByteOK(c) })
}

// EncodeValue is an event header's value as an HTTP header value.
func EncodeValue(v string) string {
	last := len(v) - 1
	return encode(v, func(i int, c byte) bool {
		if c == ' ' {
			return i != 0 && i != last
		}
		return c > ' ' && c < 0x7f && c != '%'
	})
}

func encode(s string, keep func(i int, c byte) bool) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !keep(i, s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		if c := s[i]; keep(i, c) {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	return string(b)
}

// Decode undoes EncodeName or EncodeValue. Names arrive in any case
// (HTTP servers canonicalise them): pass a name lowercased.
func Decode(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("%q: '%%' at %d is not followed by two hex digits", s, i)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("%q: '%%' at %d is not followed by two hex digits", s, i)
		}
		b = append(b, byte(v))
		i += 2
	}
	return string(b), nil
}

// reserved are the HTTP header names an event's own header may not take
// (after EncodeName): the transport's, the Standard Webhooks', the
// outbox's own and the CloudEvents HTTP binding's (ce-). Prefixes are checked too (reservedPrefixes).
var reserved = map[string]bool{
	"host": true, "connection": true, "keep-alive": true, "te": true, "trailer": true,
	"transfer-encoding": true, "upgrade": true, "expect": true, "user-agent": true,
	"accept-encoding": true, "date": true, "authorization": true, "cookie": true,
	"event_id": true, "event_type": true, "event_source": true, "aggregate_id": true,
}

var reservedPrefixes = []string{"webhook-", "outbox-", "content-", "proxy-", "ce-"}

// Reserved reports whether an event header named name (as given, before
// encoding) would take an HTTP header name that is not the event's to
// set, and why.
func Reserved(name string) (string, bool) { return reservedEncoded(EncodeName(name)) }

func reservedEncoded(enc string) (string, bool) {
	if reserved[enc] {
		return fmt.Sprintf("%q is an HTTP or outbox header name", enc), true
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(enc, p) {
			return fmt.Sprintf("names starting with %q are the transport's, the Standard Webhooks', the outbox's or CloudEvents'", p), true
		}
	}
	return "", false
}

// HeaderLen is what one header takes on an HTTP/1.1 request: name,
// ": ", value and CRLF.
func HeaderLen(name, value string) int { return len(name) + len(value) + 4 }

// Size is the most bytes an event's request takes, body and headers,
// as Publish compares it with its limit: the payload, the event's own
// headers encoded, and the headers the sink sets with their values at
// the lengths given (signatures for nsig secrets).
func Size(typ, topic, source string, idLen, payloadLen int, headers map[string]string, nsig int) int {
	n := payloadLen
	for k, v := range headers {
		n += HeaderLen(EncodeName(k), EncodeValue(v))
	}
	src := EncodeValue(source)
	msgID := idLen
	if src != "" {
		msgID += len(src) + 1
		n += len(HeaderEventSource) + len(src) + 4
	}
	n += len(HeaderID) + msgID + 4
	n += len(HeaderTimestamp) + 20 + 4
	n += len(HeaderSignature) + max(nsig, 1)*(SignatureLen+1) + 4
	n += len(HeaderEventID) + idLen + 4
	n += len(HeaderEventType) + len(EncodeValue(typ)) + 4
	n += len(HeaderAggregateID) + 36 + 4
	n += len(HeaderTopic) + len(EncodeValue(topic)) + 4
	n += len("content-type") + len("application/json") + 4
	return n
}

// EventHeaders returns an event's own headers from a request's headers
// (an http.Header), decoded: every header but the transport's, the
// Standard Webhooks' and the outbox's (see Reserved).
func EventHeaders(h map[string][]string) (map[string]string, error) {
	out := map[string]string{}
	for k, vs := range h {
		name := strings.ToLower(k)
		if _, skip := reservedEncoded(name); skip || len(vs) == 0 {
			continue
		}
		dn, err := Decode(name)
		if err != nil {
			return nil, fmt.Errorf("header name %w", err)
		}
		dv, err := Decode(vs[0])
		if err != nil {
			return nil, fmt.Errorf("header %s: value %w", name, err)
		}
		out[dn] = dv
	}
	return out, nil
}
