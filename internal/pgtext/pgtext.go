// Package pgtext checks strings against what a Postgres text column (or a
// JSONB string) of a UTF-8 database can store.
package pgtext

import "unicode/utf8"

// Invalid reports why s cannot be stored in a Postgres text column of a
// UTF-8 database (or a JSONB string), or "" when it can: it must be valid
// UTF-8 without NUL characters.
func Invalid(s string) string {
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return "contains a NUL character"
		}
	}
	return ""
}
