package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strconv"
)

// Reading usage from the tail of an over-long line (usageWriter keeps
// the tail of a line beyond maxSSELine): an Ollama NDJSON line's counts,
// an SSE data line's usage.

// ndjsonTail is how much of an over-long NDJSON line usageWriter keeps.
const ndjsonTail = 4 << 10

// ollamaCount finds a count of Ollama's answer in a line's tail.
var ollamaCount = regexp.MustCompile(`"(prompt_eval_count|eval_count)"\s*:\s*([0-9]+)`)

// readCounts records the counts found in the tail of an over-long
// NDJSON line (Ollama's last, after its context).
func (u *usageWriter) readCounts(tail []byte) {
	var total, prompt float64
	found, promptFound := false, false
	for _, m := range ollamaCount.FindAllSubmatch(tail, -1) {
		n, err := strconv.ParseFloat(string(m[2]), 64)
		if err == nil {
			total, found = total+n, true
			if string(m[1]) == "prompt_eval_count" {
				prompt, promptFound = n, true
			}
		}
	}
	if found {
		u.total, u.found = total, true
		u.promptUsed, u.promptFound = prompt, promptFound
	}
}

// sseTail is how much of an over-long SSE data line usageWriter reads:
// a Responses API response.completed event has after its usage only the
// response's user and metadata (at most 16 pairs of 64 and 512
// characters) and the event's sequence_number.
const sseTail = 16 << 10

// usageAt are the objects a usage in a tail is read from: the line's
// object (an OpenAI chunk's usage), or an object in it (a Responses API
// event's response).
var usageAt = []string{`{"usage":`, `{"response":{"usage":`}

const (
	// maxUsageTries is how many "usage" keys of a tail, from its end,
	// are tried as its usage: the real one is the last, or has after it
	// a few deeper in the response (a format's schema). Each try reads
	// the rest of the tail, so that a tail of nothing but keys would
	// cost its length squared.
	maxUsageTries = 8
	// maxUsageDepth is the deepest nesting a usage and what follows it
	// may have (a usage is an object of objects of numbers): a deeper
	// one is not tried, so that validating it allocates no parser state.
	maxUsageDepth = 32
)

// readUsageTail reads the usage in the tail of an over-long SSE data
// line. A tail is not JSON; what it takes for the usage is the last
// "usage" key whose object, and what follows it to the line's end, are
// JSON that closes the line's object, or an object in it, and then the
// line's: with nothing after the usage but its object's other members
// and the closing braces. A "usage" inside a string (an answer's text, a
// tool call's arguments) is escaped ("\"usage\"") and never a key; one
// deeper in the response (a tool's schema) is followed by more than the
// closing of two objects, or by an array's. A usage cut by the tail's
// start is not read: the estimate stands. Of the keys, the last
// maxUsageTries are tried, in one buffer: a tail costs a few times its
// length, whatever it holds.
func (u *usageWriter) readUsageTail(tail []byte) {
	var doc []byte
	end, tries := len(tail), 0
	for tries < maxUsageTries {
		at := bytes.LastIndex(tail[:end], []byte(`"usage"`))
		if at < 0 {
			return
		}
		end = at
		obj, ok := objectAfterKey(tail[at+len(`"usage"`):])
		if !ok || escaped(tail, at) {
			continue
		}
		tries++
		if !shallow(obj, maxUsageDepth) {
			continue
		}
		if doc == nil {
			doc = make([]byte, 0, len(usageAt[len(usageAt)-1])+len(tail))
		}
		for _, open := range usageAt {
			doc = append(append(doc[:0], open...), obj...)
			if json.Valid(doc) {
				u.read(doc)
				return
			}
		}
	}
}

// objectAfterKey returns what follows a key from its value on, if the
// value is an object: b is what follows the key's closing quote.
func objectAfterKey(b []byte) ([]byte, bool) {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] != ':' {
		return nil, false
	}
	b = bytes.TrimLeft(b[1:], " \t\r\n")
	return b, len(b) > 0 && b[0] == '{'
}

// shallow reports whether the brackets of b, outside its strings, nest
// no deeper than limit (closing brackets beyond its opening ones are
// the tail's enclosing objects).
func shallow(b []byte, limit int) bool {
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			if depth++; depth > limit {
				return false
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return true
}

// escaped reports whether the byte at i of b is escaped: an odd run of
// backslashes before it.
func escaped(b []byte, i int) bool {
	n := 0
	for i > 0 && b[i-1] == '\\' {
		n, i = n+1, i-1
	}
	return n%2 == 1
}
