// Package pgident validates and quotes Postgres identifiers, so that table
// and schema names from configuration are never spliced into SQL raw.
package pgident

import (
	"fmt"
	"regexp"
	"strings"
)

// MaxLen is Postgres' NAMEDATALEN-1: longer identifiers are silently
// truncated by the server, which would make two configured names collide.
const MaxLen = 63

var valid = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Validate reports whether name is a plain lower-case identifier we accept.
// We deliberately refuse mixed case and punctuation even though quoting would
// allow them: a name that needs quoting in psql is a name operators mistype.
func Validate(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s name is empty; set it or leave the field unset for the default", what)
	case len(name) > MaxLen:
		return fmt.Errorf("%s name %q is %d bytes; Postgres identifiers are at most %d", what, name, len(name), MaxLen)
	case !valid.MatchString(name):
		return fmt.Errorf("%s name %q is not a plain identifier; use lower-case letters, digits and underscores, starting with a letter or underscore", what, name)
	}
	return nil
}

// Quote returns name as a double-quoted identifier.
func Quote(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// Qualified returns "schema"."name".
func Qualified(schema, name string) string {
	return Quote(schema) + "." + Quote(name)
}
