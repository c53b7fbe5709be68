package jsonscan

import "bytes"

// stream reads a "stream" value as the backend that reads keys k
// does: with exactKeys, pydantic's lax bool (vLLM's and SGLang's
// Optional[bool]: pythonBool); with foldedKeys, Go's *bool (Ollama's
// native requests' and its /v1/responses'), of which only true and
// false are a value, a null unsetting it (anything else Go refuses,
// with the body: goStream).
func (k keys) stream(val []byte) (stream, noStream bool) {
	if k == exactKeys {
		v, ok := pythonBool(val)
		return ok && v, ok && !v
	}
	return string(val) == "true", string(val) == "false"
}

// goStream is "stream" as Go's encoding/json decodes it into a bool
// (Ollama's /v1/chat/completions and /v1/completions), where a null
// leaves the value before it.
type goStream struct {
	value bool
	// refused: a value that is neither a bool nor null (1, "true"),
	// which Go refuses, and the body with it: Ollama answers 400, so
	// its reading of the body decides nothing.
	refused bool
}

// read reads one "stream" value, val, a valid JSON token.
func (g *goStream) read(val []byte) {
	switch string(val) {
	case "null":
	case "true", "false":
		g.value = string(val) == "true"
	default:
		g.refused = true
	}
}

// pythonBool reads a JSON value as pydantic v2 validates it into a bool
// in lax mode (vLLM's and SGLang's request models): true and false; a
// number equal to 1 or 0 (1, 1.0, 1e0; Python reads 1.0000000000000001
// as 1.0); a string that is "1" or "0", or, in any ASCII letter case,
// one of "true", "t", "yes", "y", "on" and "false", "f", "no", "n",
// "off", as it stands (no spaces around). ok is false for anything else
// (null, which Optional[bool] reads as None, or a value pydantic
// refuses, the backend answering 400).
func pythonBool(val []byte) (v, ok bool) {
	switch c := val[0]; {
	case c == 't' && string(val) == "true":
		return true, true
	case c == 'f' && string(val) == "false":
		return false, true
	case c == '"':
		inner := val[1 : len(val)-1]
		if len(inner) > len(`\u0000`)*len("false") {
			return false, false // longer than any word, each letter escaped
		}
		var buf [3 * len(`\u0000`) * len("false")]byte // each byte decodes to at most 3
		if bytes.IndexByte(inner, '\\') >= 0 {
			inner = unescape(buf[:0], inner)
		}
		switch {
		case string(inner) == "1", equalFoldASCII(inner, "true", "t", "yes", "y", "on"):
			return true, true
		case string(inner) == "0", equalFoldASCII(inner, "false", "f", "no", "n", "off"):
			return false, true
		}
	case c == '-' || c >= '0' && c <= '9' || c == 'N' || c == 'I':
		switch f, err := parseFloat(string(val)); {
		case err != nil:
		case f == 1:
			return true, true
		case f == 0:
			return false, true
		}
	}
	return false, false
}

// equalFoldASCII reports whether s is one of words (lower-case ASCII)
// in any ASCII letter case, as Rust's eq_ignore_ascii_case compares.
// It allocates nothing.
func equalFoldASCII(s []byte, words ...string) bool {
	for _, w := range words {
		if len(s) != len(w) {
			continue
		}
		i := 0
		for i < len(s) && s[i]|0x20 == w[i] && (s[i] >= 'A' && s[i] <= 'Z' || s[i] >= 'a' && s[i] <= 'z') {
			i++
		}
		if i == len(s) {
			return true
		}
	}
	return false
}
