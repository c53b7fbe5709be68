package caddyfairqueue

import (
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// replaceJSON replaces the known placeholders of tmpl, a JSON template.
// A placeholder lies inside one JSON string, where its value is
// JSON-escaped, or wholly outside strings (a number such as
// {http.fair_queue.retry_after}), where its value is written only when
// it is a JSON number, true, false or null, and null otherwise: a value
// a client chose can never add structure to the answer. A brace that
// does not open a known placeholder, JSON's own braces and backslashes
// are copied as they are (Caddy's replacer is not used: it takes `\{`
// for an escaped brace and may read a placeholder across two JSON
// strings).
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
			replacePlaceholders(&b, repl, tmpl[start:i], inString)
			b.WriteByte('"')
			start, inString = i+1, !inString
		}
	}
	replacePlaceholders(&b, repl, tmpl[start:], inString)
	return b.String()
}

// replacePlaceholders writes seg to b, each {key} whose key repl knows
// replaced by its value: JSON-escaped inside a string, a JSON scalar or
// null outside one.
func replacePlaceholders(b *strings.Builder, repl *caddy.Replacer, seg string, inString bool) {
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
				if inString {
					b.WriteString(jsonEscape(caddy.ToString(v)))
				} else {
					b.WriteString(jsonScalar(caddy.ToString(v)))
				}
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

// jsonScalar is s when s is exactly a JSON number, true, false or null
// (no space around it), else null.
func jsonScalar(s string) string {
	switch s {
	case "true", "false", "null":
		return s
	}
	if jsonscan.IsNumber([]byte(s)) {
		return s
	}
	return "null"
}
