// Package rowheaders decodes an outbox row's headers column, for both
// sources of the relay.
package rowheaders

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
)

// The reasons of a refused row: relay.ReasonUndecodable and
// relay.ReasonReservedHeader (decode_test.go holds them equal).
const (
	reasonUndecodable    = "undecodable"
	reasonReservedHeader = "reserved_header"
)

// Decode reads a row's headers column: SQL NULL, JSON null or a JSON
// object of strings (not null, names not empty: what the insert guard
// accepts) whose names the relayer does not set itself. Anything else is a
// permanent failure of that row, returned as permanent(reason, err) with
// reason relay.ReasonUndecodable or relay.ReasonReservedHeader (the
// caller passes relay.PermanentReason). Every source of Messages (the
// polling claim, the WAL source) decodes headers with it, so a row is
// published or refused the same way whichever source reads it.
func Decode(raw []byte, permanent func(reason string, err error) error) (map[string]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	// Pointers tell a null value, which would decode as "", from "".
	var h map[string]*string
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, permanent(reasonUndecodable, fmt.Errorf("headers %s are not a JSON object of string values (%s); rewrite them as {\"name\": \"value\", ...} or park the row", clip.Text(string(raw), 200), err))
	}
	// Undecodable before reserved, whatever the map's order, so that a
	// row's reason does not vary.
	out := make(map[string]string, len(h))
	for k, v := range h {
		switch {
		case k == "":
			return nil, permanent(reasonUndecodable, fmt.Errorf("headers %s have an empty name; rename it in the row's headers or park the row", clip.Text(string(raw), 200)))
		case v == nil:
			return nil, permanent(reasonUndecodable, fmt.Errorf("header %q is null, not a string; set a value or drop the header in the row, or park the row", k))
		}
		out[k] = *v
	}
	if !utf8.Valid(raw) { // a SQL_ASCII database's bytes: keep them (headerbytes.go)
		var err error
		if out, err = headerBytes(raw); err != nil {
			return nil, permanent(reasonUndecodable, fmt.Errorf("headers %s could not be read byte for byte (%s); rewrite them as {\"name\": \"value\", ...} or park the row", clip.Text(string(raw), 200), err))
		}
	}
	for k := range out {
		if outbox.IsReservedHeader(k) {
			return nil, permanent(reasonReservedHeader, fmt.Errorf("header %q is set by the relayer and cannot come from the row; rename it in the row's headers or park the row", k))
		}
	}
	return out, nil
}
