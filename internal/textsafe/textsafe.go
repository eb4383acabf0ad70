// Package textsafe says which characters of text clipshard did not write
// (clip ids, paths, a damaged manifest's strings) must not reach a
// terminal as they are — C0 and C1 control characters, DEL, the bidi
// controls that reorder a line (U+202E) and bytes that are not UTF-8 —
// and escapes them.
package textsafe

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Unsafe reports whether r is a control character (C0, DEL, C1) or a
// bidirectional formatting character (U+061C, U+200E, U+200F,
// U+202A-U+202E, U+2066-U+2069).
func Unsafe(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return r == utf8.RuneError
}

// First returns the first unsafe character of s and its byte offset, or
// ok false (an invalid UTF-8 byte is utf8.RuneError).
func First(s string) (r rune, at int, ok bool) {
	for i, c := range s {
		if Unsafe(c) {
			return c, i, true
		}
	}
	return 0, 0, false
}

// Escape returns s with each unsafe character written as an escape
// (\x1b, \u202e; an invalid byte as \xff); with lines, newlines and tabs
// are kept as they are.
func Escape(s string, lines bool) string {
	if _, _, bad := First(s); !bad {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case lines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x80 && Unsafe(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case Unsafe(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
