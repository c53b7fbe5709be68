package caddyfairqueue

import (
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// replaceJSON replaces the known placeholders of tmpl, a JSON template,
// with their values JSON-escaped. A placeholder lies inside one JSON
// string, or wholly outside strings (a number such as
// {http.fair_queue.retry_after}); a brace that does not open a known
// placeholder, JSON's own braces and backslashes are copied as they are
// (Caddy's replacer is not used: it takes `\{` for an escaped brace and
// may read a placeholder across two JSON strings).
func replaceJSON(repl *caddy.Replacer, tmpl string) string {
	var b strings.Builder
	b.Grow(len(tmpl))
	start, inString := 0, false // start: the current segment's first byte
	for i := 0; i < len(tmpl); i++ {
		switch c := tmpl[i]; {
		case inString && c == '\\':
			i++ // an escaped character, perhaps a quote
		case c == '"':
			// A segment ends: a string's content, or what lies between
			// strings.
			replacePlaceholders(&b, repl, tmpl[start:i])
			b.WriteByte('"')
			start, inString = i+1, !inString
		}
	}
	replacePlaceholders(&b, repl, tmpl[start:])
	return b.String()
}

// replacePlaceholders writes seg to b, each {key} whose key repl knows
// replaced by its value, JSON-escaped.
func replacePlaceholders(b *strings.Builder, repl *caddy.Replacer, seg string) {
	for {
		open := strings.IndexByte(seg, '{')
		if open < 0 {
			b.WriteString(seg)
			return
		}
		b.WriteString(seg[:open])
		seg = seg[open:]
		end := strings.IndexAny(seg[1:], "{}")
		if end >= 0 && seg[1+end] == '}' && end > 0 {
			key := seg[1 : 1+end]
			if v, ok := repl.Get(key); ok && !strings.ContainsAny(key, " \t\r\n\\") {
				b.WriteString(jsonEscape(caddy.ToString(v)))
				seg = seg[2+end:]
				continue
			}
		}
		b.WriteByte('{')
		seg = seg[1:]
	}
}

// jsonEscape escapes s for the inside of a JSON string.
func jsonEscape(s string) string {
	b := encodeJSON(s)
	return string(b[1 : len(b)-1])
}
