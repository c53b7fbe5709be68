package jsonscan

import (
	"bytes"
	"encoding/binary"
	"unicode/utf16"
	"unicode/utf8"
)

// Python's json.loads, with which FastAPI reads a JSON body (vLLM,
// SGLang), takes bytes in UTF-8, UTF-16 or UTF-32: pythonText reads a
// body's bytes as it does.

// utf8BOM is the UTF-8 byte order mark.
var utf8BOM = []byte("\xef\xbb\xbf")

// pythonText is b decoded as Python's json.loads decodes bytes
// (json.detect_encoding): UTF-32 or UTF-16 by its byte order mark (which
// is dropped), or by the zero bytes of its first four (a JSON text
// starts with an ASCII character), transcoded to UTF-8 (a lone surrogate
// as U+FFFD); UTF-8 past its byte order mark; ok is false where Python
// cannot decode it (an odd length of UTF-16, a UTF-32 unit beyond
// Unicode). Only a body in UTF-16 or UTF-32 is copied.
func pythonText(b []byte) (text []byte, ok bool) {
	be, le := binary.BigEndian, binary.LittleEndian
	switch {
	case bytes.HasPrefix(b, []byte{0, 0, 0xfe, 0xff}):
		return fromUTF32(b[4:], be)
	case bytes.HasPrefix(b, []byte{0xff, 0xfe, 0, 0}):
		return fromUTF32(b[4:], le)
	case bytes.HasPrefix(b, []byte{0xfe, 0xff}):
		return fromUTF16(b[2:], be)
	case bytes.HasPrefix(b, []byte{0xff, 0xfe}):
		return fromUTF16(b[2:], le)
	case bytes.HasPrefix(b, utf8BOM):
		return b[len(utf8BOM):], true
	case len(b) >= 4 && b[0] == 0 && b[1] != 0:
		return fromUTF16(b, be)
	case len(b) >= 4 && b[0] == 0:
		return fromUTF32(b, be)
	case len(b) >= 4 && b[1] == 0 && (b[2] != 0 || b[3] != 0):
		return fromUTF16(b, le)
	case len(b) >= 4 && b[1] == 0:
		return fromUTF32(b, le)
	case len(b) == 2 && b[0] == 0:
		return fromUTF16(b, be)
	case len(b) == 2 && b[1] == 0:
		return fromUTF16(b, le)
	}
	return b, true
}

// fromUTF16 transcodes UTF-16 of byte order o to UTF-8.
func fromUTF16(b []byte, o binary.ByteOrder) ([]byte, bool) {
	if len(b)%2 != 0 {
		return nil, false
	}
	n := 0 // the UTF-8 length, so that the copy is allocated once
	eachUTF16(b, o, func(r rune) { n += utf8.RuneLen(r) })
	out := make([]byte, 0, n)
	eachUTF16(b, o, func(r rune) { out = utf8.AppendRune(out, r) })
	return out, true
}

// eachUTF16 calls f with each rune of UTF-16 b of byte order o (of even
// length), a lone surrogate as U+FFFD.
func eachUTF16(b []byte, o binary.ByteOrder, f func(rune)) {
	for i := 0; i < len(b); i += 2 {
		r := rune(o.Uint16(b[i:]))
		if utf16.IsSurrogate(r) {
			dec := utf8.RuneError
			if i+4 <= len(b) {
				dec = utf16.DecodeRune(r, rune(o.Uint16(b[i+2:])))
			}
			if dec != utf8.RuneError {
				i += 2
			}
			r = dec
		}
		f(r)
	}
}

// fromUTF32 transcodes UTF-32 of byte order o to UTF-8.
func fromUTF32(b []byte, o binary.ByteOrder) ([]byte, bool) {
	if len(b)%4 != 0 {
		return nil, false
	}
	n := 0
	for i := 0; i < len(b); i += 4 {
		r := o.Uint32(b[i:])
		if r > utf8.MaxRune {
			return nil, false
		}
		if utf16.IsSurrogate(rune(r)) {
			n += utf8.RuneLen(utf8.RuneError)
		} else {
			n += utf8.RuneLen(rune(r))
		}
	}
	out := make([]byte, 0, n)
	for i := 0; i < len(b); i += 4 {
		out = utf8.AppendRune(out, rune(o.Uint32(b[i:]))) // a surrogate: U+FFFD
	}
	return out, true
}
