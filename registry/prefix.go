package registry

import (
	"fmt"
	"unicode"
)

// maxPrefix bounds a key prefix (it starts every key).
const maxPrefix = 64

// CheckPrefix reports whether p can be a key prefix. Every key of a pool
// is "{<prefix>:<pool>}:…": the braces make the Redis Cluster hash tag, so
// a brace in the prefix would end the tag early (keys of one pool would
// land in different slots and every script would fail with CROSSSLOT),
// and a colon would make the prefix ambiguous with the pool. Spaces and
// control characters are refused too. The error names the first bad
// character and where it is. The empty prefix is allowed: it means the
// default.
func CheckPrefix(p string) error {
	if len(p) > maxPrefix {
		return fmt.Errorf("key prefix %q is %d bytes long; at most %d", p, len(p), maxPrefix)
	}
	for i, c := range p {
		var why string
		switch {
		case c == '{' || c == '}':
			why = "braces delimit the Redis Cluster hash tag"
		case c == ':':
			why = "a colon separates the prefix from the pool"
		case unicode.IsSpace(c) || unicode.IsControl(c):
			why = "spaces and control characters are not allowed"
		default:
			continue
		}
		return fmt.Errorf("key prefix %q: character %q at byte %d not allowed (%s)", p, c, i, why)
	}
	return nil
}
