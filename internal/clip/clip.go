// Package clip shortens text for logs, errors and tables: a 2 MB type or a
// broker error quoting a payload stays readable and bounded.
package clip

import "strings"

// Text returns s cut to at most n bytes on a rune boundary, with "..." to
// mark the cut; s itself when it fits.
func Text(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}
