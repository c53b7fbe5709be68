package jsonscan

import "strconv"

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
		if len(val) > 2+len(`\u0000`)*len("false") {
			return false, false // longer than any word, each letter escaped
		}
		switch s := unquote(val); {
		case s == "1", equalFoldASCII(s, "true", "t", "yes", "y", "on"):
			return true, true
		case s == "0", equalFoldASCII(s, "false", "f", "no", "n", "off"):
			return false, true
		}
	case c == '-' || c >= '0' && c <= '9' || c == 'N' || c == 'I':
		switch f, err := strconv.ParseFloat(string(val), 64); {
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
func equalFoldASCII(s string, words ...string) bool {
	for _, w := range words {
		if len(s) == len(w) && asciiLower(s) == w {
			return true
		}
	}
	return false
}

// asciiLower is s with its ASCII capitals in lower case, other bytes
// as they are.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
