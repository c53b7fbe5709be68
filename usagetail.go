package caddyfairqueue

import (
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

// usageKey finds a "usage" key whose value is an object.
var usageKey = regexp.MustCompile(`"usage"\s*:\s*\{`)

// usageAt are the objects a usage in a tail is read from: the line's
// object (an OpenAI chunk's usage), or an object in it (a Responses API
// event's response).
var usageAt = []string{`{"usage":`, `{"response":{"usage":`}

// readUsageTail reads the usage in the tail of an over-long SSE data
// line. A tail is not JSON; what it takes for the usage is the last
// "usage" key whose object, and what follows it to the line's end, are
// JSON that closes the line's object, or an object in it, and then the
// line's: with nothing after the usage but its object's other members
// and the closing braces. A "usage" inside a string (an answer's text, a
// tool call's arguments) is escaped ("\"usage\"") and never a key; one
// deeper in the response (a tool's schema) is followed by more than the
// closing of two objects, or by an array's. A usage cut by the tail's
// start is not read: the estimate stands.
func (u *usageWriter) readUsageTail(tail []byte) {
	keys := usageKey.FindAllIndex(tail, -1)
	for i := len(keys) - 1; i >= 0; i-- {
		at, obj := keys[i][0], tail[keys[i][1]-1:]
		if escaped(tail, at) {
			continue
		}
		for _, open := range usageAt {
			if doc := append([]byte(open), obj...); json.Valid(doc) {
				u.read(doc)
				return
			}
		}
	}
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
