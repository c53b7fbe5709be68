// Package jsonscan reads what fair_queue needs of a JSON request body
// without decoding it: whether it is one JSON value (Valid), and the
// top-level fields that decide how a request waits (Sniff). Chat bodies
// are mostly long strings; both skip them quickly.
package jsonscan

import (
	"bytes"
	"encoding/binary"
)

// Valid reports whether b is one JSON value, with what json.Valid
// accepts and nothing else: RFC 8259's grammar, any byte from 0x20 up
// inside strings (no UTF-8 check), at most MaxDepth open arrays and
// objects. It runs several times faster than json.Valid on chat requests,
// whose bytes are mostly long strings (the messages): those are skipped
// sixteen bytes at a time. FuzzValidJSON holds it to json.Valid.
func Valid(b []byte) bool { return valid(b, false) }

// ValidPython reports whether b is one JSON value as Python's json.loads
// reads it (vLLM, SGLang): Valid's, with NaN, Infinity and -Infinity as
// numbers too.
func ValidPython(b []byte) bool { return valid(b, true) }

func valid(b []byte, python bool) bool {
	var nest [32]byte
	open := nest[:0] // the arrays and objects around i: '[' or '{'
	i := skipSpace(b, 0)
	for {
		// A value starts at i.
		if i >= len(b) {
			return false
		}
		var ok bool
		switch c := b[i]; c {
		case '{', '[':
			if len(open) == MaxDepth {
				return false
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' or ']': empty
				i, ok = i+1, true
				break
			}
			open = append(open, c)
			if c == '{' {
				if i, ok = memberKey(b, i); !ok {
					return false
				}
			}
			continue
		case '"':
			i, ok = skipString(b, i)
		case 't':
			i, ok = literal(b, i, "true")
		case 'f':
			i, ok = literal(b, i, "false")
		case 'n':
			i, ok = literal(b, i, "null")
		case 'N', 'I':
			i, ok = pythonNumber(b, i, python)
		case '-':
			if i+1 < len(b) && b[i+1] == 'I' {
				i, ok = pythonNumber(b, i, python)
				break
			}
			i, ok = number(b, i)
		default:
			i, ok = number(b, i)
		}
		if !ok {
			return false
		}
		// A value ended at i: close what it ends, then expect the next.
		i = skipSpace(b, i)
		for {
			if len(open) == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			top := open[len(open)-1]
			if b[i] == top+2 {
				open = open[:len(open)-1]
				i = skipSpace(b, i+1)
				continue
			}
			if b[i] != ',' {
				return false
			}
			i = skipSpace(b, i+1)
			if top == '{' {
				if i, ok = memberKey(b, i); !ok {
					return false
				}
			}
			break
		}
	}
}

// MaxDepth is encoding/json's limit of nested arrays and objects.
const MaxDepth = 10000

// memberKey reads `"key" :` at i and returns where the value may start.
func memberKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	i, ok := skipString(b, i)
	if !ok {
		return i, false
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return i, false
	}
	return skipSpace(b, i+1), true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

// SWAR constants: a byte of x is below 0x20, a quote or a backslash when
// the matching test below has its high bit set. Each test is exact in
// the one thing it is used for: whether any byte of the word matches.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plain reports whether none of the 8 bytes of x is a control character,
// '"' or '\\': a word a string's scan can step over whole.
func plain(x uint64) bool {
	control := (x - 0x20*ones) &^ x
	quote := x ^ '"'*ones
	quote = (quote - ones) &^ quote
	bs := x ^ '\\'*ones
	bs = (bs - ones) &^ bs
	return (control|quote|bs)&highs == 0
}

// skipString reads the string that starts at b[i] == '"' and returns the
// index after its closing quote; false if it is not a valid string.
func skipString(b []byte, i int) (int, bool) {
	i++
	for {
		for i+16 <= len(b) {
			w := b[i : i+16 : i+16] // two words, one bounds check
			if !plain(binary.LittleEndian.Uint64(w[:8])) || !plain(binary.LittleEndian.Uint64(w[8:])) {
				break
			}
			i += 16
		}
		for i+8 <= len(b) && plain(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		if i >= len(b) {
			return i, false
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(b) {
				return i, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !hex4(b[i+2:i+6]) {
					return i, false
				}
				i += 6
			default:
				return i, false
			}
		case c < 0x20:
			return i, false
		default:
			i++
		}
	}
}

func hex4(h []byte) bool {
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

func literal(b []byte, i int, word string) (int, bool) {
	if !bytes.HasPrefix(b[i:], []byte(word)) {
		return i, false
	}
	return i + len(word), true
}

// pythonNumber reads Python's NaN, Infinity or -Infinity at i, when
// python.
func pythonNumber(b []byte, i int, python bool) (int, bool) {
	if !python {
		return i, false
	}
	for _, word := range []string{"NaN", "Infinity", "-Infinity"} {
		if j, ok := literal(b, i, word); ok {
			return j, true
		}
	}
	return i, false
}

// IsNumber reports whether b is exactly one JSON number, with no space
// around it.
func IsNumber(b []byte) bool {
	end, ok := number(b, 0)
	return ok && end == len(b)
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? at i.
func number(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return i, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return i, false
		}
		i = j
	}
	return i, true
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}
