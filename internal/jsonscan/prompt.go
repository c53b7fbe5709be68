package jsonscan

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// The prompt's text and the completion budget of a request body: what
// fair_queue weighs a request by when it counts KV-cache tokens.

// prompt is the text of one top-level prompt key: its decoded bytes, and
// whether the key's value has a type that holds a prompt.
type prompt struct {
	n     int64
	found bool
	batch int64 // the prompts of a batch ("prompt": an array of strings or of token arrays)
	ids   int64 // the tokens sent as ids (numbers) rather than text
	// media is the prompt's parts that are not text (an image, audio),
	// whose tokens the backend counts and n does not.
	media int64
	// reasoning: n holds an assistant message's reasoning, which a chat
	// template may leave out.
	reasoning bool
}

// message is what one element of "messages" adds to the prompt.
type message struct {
	content, calls int64 // the content's text, the tool calls' JSON
	media, images  int64 // content parts that are not text; Ollama's images
	// reasoning is the text of an assistant message's reasoning, by
	// reasoningKeys: the longest counts.
	reasoning [2]int64
}

// reasoningKeys are the keys of an assistant message's reasoning, which
// the chat template of a reasoning model renders into the prompt
// (interleaved thinking), as k reads them: with exactKeys vLLM's
// "reasoning" and SGLang's (and vLLM's older) "reasoning_content", of
// which a client may send both (an answer of vLLM's holds both, sent
// back as it came); with foldedKeys Ollama's "thinking".
func reasoningKeys(k keys) []string {
	if k == foldedKeys {
		return foldedReasoningKeys
	}
	return exactReasoningKeys
}

var exactReasoningKeys, foldedReasoningKeys = []string{"reasoning", "reasoning_content"}, []string{"thinking"}

// messagesText is the text of "messages": the "content" of each message
// object, a string or an array of parts (a string part, or an object
// part's "text" or "refusal" string), the JSON of an assistant
// message's "tool_calls" and its reasoning (reasoningKeys), which the chat template renders into the
// prompt. Roles, names and images are not text the model reads as
// prose, or are small: they are not counted as text. Each content part
// that is not text, and each of Ollama's "images" of a message, is one of
// the prompt's media.
//
// b is the body, and at are where the values of the "messages" keys
// that count start in it, in order: the last one, or with foldedKeys the
// arrays with elements since the last empty array or null (one of those
// is a prompt of its own, and counts alone). Go's encoding/json, which
// reads Ollama's requests, decodes a repeated array into the elements of
// the one before: a message whose repeat has no content, or a null one,
// keeps the content it had, and elements past a shorter repeat's end may
// come back with a longer one. So the message at an index of the last
// array is that of each array long enough, in turn, each starting from
// the one before; its tool calls (an array, decoded into the one before
// too) count the longer of the two. That may count more than Ollama runs
// for such a body, never less. The arrays are walked side by side, an
// index at a time, each dropped at its end: a short repeat of a long
// array costs its own length, not the long one's, and nothing is kept
// per message, only where each array is (a body of many messages under
// two keys costs two ints, not a record per message).
func messagesText(b []byte, at []int, k keys) prompt {
	if len(at) == 0 || b[at[0]] != '[' {
		return prompt{}
	}
	p := prompt{found: true}
	for j := range at {
		at[j]++ // past the '['
	}
	for {
		var m message
		again, live := false, at[:0]
		for j, i := range at {
			msg, next, ok := element(b, i)
			if !ok {
				if j == len(at)-1 {
					return p // the last array has ended: so has the prompt
				}
				continue
			}
			m = m.read(msg, again, k)
			again = true
			live = append(live, next)
		}
		reasoning := max(m.reasoning[0], m.reasoning[1])
		p.n += m.content + m.calls + reasoning
		p.reasoning = p.reasoning || reasoning > 0
		p.media += m.media + m.images
		at = live
	}
}

// read is m, the message at its index of the arrays before (again: there
// is one), with msg, the element of the next array, decoded into it.
func (m message) read(msg []byte, again bool, k keys) message {
	if msg[0] != '{' {
		return m
	}
	eachMember(msg, func(key, v []byte) {
		switch {
		case k.is(key, "content"):
			if !k.keepsOnNull("content", v) {
				m.content, m.media = contentText(v, k)
			}
		case k.is(key, "tool_calls"):
			calls := toolsText(v)
			if again && hasElements(v) {
				calls = max(calls, m.calls)
			}
			m.calls = calls
		case k.is(key, "images"):
			m.images = elements(v)
		default:
			for i, name := range reasoningKeys(k) {
				if k.is(key, name) && !k.keepsOnNull(name, v) {
					m.reasoning[i] = max(stringLen(v), 0)
				}
			}
		}
	})
	return m
}

// element is the element of a valid JSON array at i of b (after its
// '[' or an element's ','), and where the next starts, if the array has
// one there.
func element(b []byte, i int) (el []byte, next int, ok bool) {
	s := scanner{b: b, i: i}
	s.space()
	if s.i >= len(s.b) || s.peek() == ']' {
		return nil, 0, false
	}
	start := s.i
	s.value()
	el = s.b[start:s.i]
	s.space()
	if s.peek() == ',' {
		s.i++
	}
	return el, s.i, true
}

// emptyArray reports whether val is an array without elements.
func emptyArray(val []byte) bool {
	s := scanner{b: val, i: 1}
	s.space()
	return val[0] == '[' && s.peek() == ']'
}

// hasElements reports whether val is an array with an element (Ollama's
// "images").
func hasElements(val []byte) bool {
	found := false
	if val[0] == '[' {
		eachElement(val, func([]byte) { found = true })
	}
	return found
}

// toolsText is the length of the JSON of "tools" or "functions" (the
// definitions a chat template renders into the prompt) or of a
// message's "tool_calls": an array, counted as it is sent.
func toolsText(val []byte) int64 {
	if val[0] != '[' {
		return 0
	}
	return int64(len(val))
}

// toolsAgain is toolsText of a "tools" or "functions" key that may
// repeat one before it, of length prev. Go's encoding/json (foldedKeys)
// decodes a repeated array into the elements of the one before, so that
// a definition sent again as {} keeps what it had: the longest since the
// last empty array or null counts (as much as Ollama renders, or more).
func toolsAgain(prev int64, val []byte, k keys) int64 {
	n := toolsText(val)
	if k == foldedKeys && hasElements(val) {
		return max(n, prev)
	}
	return n
}

// contentText is the text of a message's content: a string, or the
// strings and the "text" of the object parts of an array (a refusal
// part's "refusal", the Chat Completions and Responses APIs' assistant
// text; SGLang's "thinking" part's "thinking", an assistant message's
// reasoning, which its chat template renders); media counts the object
// parts without such a string (an image, audio, a file) but vLLM's and
// SGLang's "tool_reference" part (GLM's deferred tools), which names a
// tool of "tools".
func contentText(v []byte, k keys) (n, media int64) {
	switch v[0] {
	case '"':
		return textLen(v), 0
	case '[':
		eachElement(v, func(part []byte) {
			switch part[0] {
			case '"':
				n += textLen(part)
			case '{':
				// The last of each key counts; a refusal part's text
				// is its "refusal", SGLang's thinking part's its
				// "thinking" (or "text").
				var text, refusal, thinking int64 = -1, -1, -1
				reference := false
				eachMember(part, func(key, v []byte) {
					switch {
					case k.is(key, "text"):
						text = stringLen(v)
					case k.is(key, "refusal"):
						refusal = stringLen(v)
					case k.is(key, "thinking"):
						thinking = stringLen(v)
					case k.is(key, "type"):
						// A string's value, exact (pydantic's Literal)
						reference = v[0] == '"' && exactKeys.is(v, "tool_reference")
					}
				})
				if text < 0 {
					text = max(refusal, thinking)
				}
				if text < 0 && reference {
					text = 0 // a tool's name: its definition is in "tools"
				}
				n += max(text, 0)
				if text < 0 {
					media++
				}
			}
		})
	}
	return n, media
}

// stringLen is the text of a string, and -1 for a value of another
// type.
func stringLen(v []byte) int64 {
	if v[0] != '"' {
		return -1
	}
	return textLen(v)
}

// promptText is the text of "prompt" (completions, Ollama's generate): a
// string, or the strings of an array (a batch, whose strings and token
// arrays are each a prompt; an array of numbers is one prompt's tokens).
func promptText(val []byte) prompt {
	switch val[0] {
	case '"':
		return prompt{n: textLen(val), found: true}
	case '[':
		var n, batch, ids int64
		eachElement(val, func(el []byte) {
			switch el[0] {
			case '"':
				n += textLen(el)
				batch++
			case '[':
				ids += tokenIDs(el)
				batch++
			default:
				ids += isNumber(el)
			}
		})
		return prompt{n: n, found: true, batch: batch, ids: ids}
	}
	return prompt{}
}

// inputText is the text of "input" (the Responses API, embeddings): a
// string, or an array of strings and of items whose "content" is text
// as a message's is, or whose "output" is (a tool's result, such as a
// function_call_output: what a chat request's tool message holds), and
// the JSON of an item whose "arguments" is a string (a function_call:
// what a chat request's tool_calls hold); and its token ids
// (embeddings': an array of numbers, or of such arrays).
func inputText(val []byte, k keys) prompt {
	switch val[0] {
	case '"':
		return prompt{n: textLen(val), found: true}
	case '[':
		var n, ids int64
		var media int64
		eachElement(val, func(el []byte) {
			switch el[0] {
			case '"':
				n += textLen(el)
			case '[':
				ids += tokenIDs(el)
			case '{':
				var content, output, call int64
				var contentMedia, outputMedia int64
				eachMember(el, func(key, v []byte) {
					switch {
					case k.is(key, "content"):
						content, contentMedia = contentText(v, k)
					case k.is(key, "output"):
						output, outputMedia = contentText(v, k)
					case k.is(key, "arguments"):
						call = 0
						if v[0] == '"' {
							call = int64(len(el))
						}
					}
				})
				n += content + output + call
				media += contentMedia + outputMedia
			default:
				ids += isNumber(el)
			}
		})
		return prompt{n: n, found: true, ids: ids, media: media}
	}
	return prompt{}
}

// tokenIDs is the number of token ids (numbers) in an array: a prompt
// sent as tokens (completions' "prompt", embeddings' "input", Ollama's
// "context").
func tokenIDs(arr []byte) int64 {
	if arr[0] != '[' {
		return 0
	}
	var ids int64
	eachElement(arr, func(el []byte) { ids += isNumber(el) })
	return ids
}

// isNumber is 1 for a JSON number, 0 for another value.
func isNumber(v []byte) int64 {
	if v[0] == '-' || (v[0] >= '0' && v[0] <= '9') {
		return 1
	}
	return 0
}

// stringText is the text of a key whose value is a string ("system",
// "instructions").
func stringText(val []byte) prompt {
	if val[0] != '"' {
		return prompt{}
	}
	return prompt{n: textLen(val), found: true}
}

// numPredict is Ollama's "options": {"num_predict": n} as a token count
// (its -1, no limit, and -2, fill the context, are none), read as Go
// reads it (goTokenCount), and whether the options name it.
func numPredict(val []byte) (n int64, found bool) {
	if val[0] != '{' {
		return 0, false
	}
	eachMember(val, func(key, v []byte) {
		if exactKeys.is(key, "num_predict") {
			n, found = goTokenCount(v), true
		}
	})
	return n, found
}

// eachMember calls f with the key (quoted) and the value of each member
// of obj, a valid JSON object.
func eachMember(obj []byte, f func(key, val []byte)) {
	s := scanner{b: obj, i: 1}
	for {
		s.space()
		if s.peek() != '"' { // '}' of an empty object
			return
		}
		key := s.str()
		s.space()
		s.i++ // ':'
		s.space()
		start := s.i
		s.value()
		f(key, obj[start:s.i])
		s.space()
		if s.peek() != ',' {
			return
		}
		s.i++
	}
}

// eachElement calls f with each element of arr, a valid JSON array.
func eachElement(arr []byte, f func(el []byte)) {
	s := scanner{b: arr, i: 1}
	for {
		s.space()
		if s.i >= len(s.b) || s.peek() == ']' {
			return
		}
		start := s.i
		s.value()
		f(arr[start:s.i])
		s.space()
		if s.peek() != ',' {
			return
		}
		s.i++
	}
}

// textLen is the length in bytes of a JSON string token (quotes
// included) once decoded as encoding/json decodes it: each escape
// resolved, a lone or broken surrogate escape and each invalid UTF-8
// byte as U+FFFD (3 bytes). It allocates nothing.
func textLen(tok []byte) int64 {
	s := tok[1 : len(tok)-1]
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return int64(len(s))
	}
	var n int64
	for r := 0; r < len(s); {
		c := s[r]
		switch {
		case c == '\\' && s[r+1] == 'u':
			rr := escapedRune(s[r+2:])
			r += 6
			if utf16.IsSurrogate(rr) {
				if r+6 <= len(s) && s[r] == '\\' && s[r+1] == 'u' {
					if dec := utf16.DecodeRune(rr, escapedRune(s[r+2:])); dec != utf8.RuneError {
						n, r = n+4, r+6
						continue
					}
				}
				rr = utf8.RuneError
			}
			n += int64(utf8.RuneLen(rr))
		case c == '\\':
			n, r = n+1, r+2
		case c < utf8.RuneSelf:
			n, r = n+1, r+1
		default:
			rr, size := utf8.DecodeRune(s[r:])
			n, r = n+int64(utf8.RuneLen(rr)), r+size
		}
	}
	return n
}

// escapedRune reads the four hex digits of a \u escape of a valid JSON string.
func escapedRune(h []byte) rune {
	var r rune
	for _, c := range h[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default: // 'A' to 'F'
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}
