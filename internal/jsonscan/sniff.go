package jsonscan

import (
	"bytes"
	"cmp"
	"encoding/json"
	"unicode/utf8"
)

// Fields are what the handler reads from a JSON request body.
type Fields struct {
	// Stream is "stream": true; with exact keys, also what pydantic's
	// lax bool reads as true (1, "true", "yes", "on": pythonBool).
	Stream bool
	// NoStream is "stream": false (with exact keys, what pydantic
	// reads as false), which Ollama's native API needs to answer in one
	// piece (it streams by default).
	NoStream bool
	Model    string // "model": "<string>"
	// MaxTokens is the largest of "max_tokens", "max_completion_tokens"
	// (OpenAI chat) and "max_output_tokens" (Responses API) that is a
	// positive number (or a string of one, as vLLM and SGLang take it),
	// rounded up, saturated at 1<<53; 0 if none.
	MaxTokens int64
	// Budget is the completion budget the body sets for an
	// OpenAI-compatible API (vLLM, SGLang, Ollama's /v1): the first of
	// "max_completion_tokens", "max_output_tokens" and "max_tokens" that
	// is a positive number (or a string of one), rounded up, saturated
	// at 1<<53; 0 if none.
	Budget int64
	// NumPredict is the completion budget the body sets for Ollama's
	// native API, which reads no other: "options": {"num_predict"} when
	// a positive number, as Budget's; 0 if none (its -1 and -2 too).
	NumPredict int64
	// Completions is how many completions an OpenAI-compatible backend
	// (vLLM, SGLang) generates for the body, each up to the budget and
	// holding its own tokens in the KV cache: the larger of "n" and
	// "best_of" that is a positive number (or a string of one), else 1,
	// times the prompts of a "prompt" batch (an array of strings or of
	// token arrays), saturated at 1<<53; 0 (one) if the body has none of
	// these.
	Completions int64
	// PromptBytes is the length in bytes of the prompt's text, decoded
	// as encoding/json decodes it (escapes resolved; an invalid UTF-8
	// byte or a broken surrogate escape is U+FFFD, 3 bytes): the
	// "content" of each of "messages" (a string, or the string parts
	// and the "text", else "refusal" or "thinking", of the object parts of an array), "prompt" (a
	// string, or the strings of an array), "system" and "instructions"
	// (the Responses API's; a string) and "input" (the Responses API's
	// and embeddings': a string, or an array of strings and of items
	// whose "content", or a tool result's "output", is as a message's
	// content), "suffix" (a fill-in-the-middle request's text after the
	// cursor; a string) and Ollama's "template" (a string); and the
	// length of the JSON of "tools" and "functions"
	// (arrays of definitions), of each message's "tool_calls" (an
	// array), and (exact keys) of "documents" (an array) and
	// "chat_template_kwargs" (an object), which a chat template renders
	// into the prompt.
	PromptBytes int64
	// PromptTokens is the prompt's tokens sent as ids rather than text:
	// the numbers of "prompt" and of "input" (an array of token ids, or
	// a batch of such arrays: completions' and embeddings') and of
	// Ollama's "context" (the tokens of the conversation so far), and of
	// SGLang's "input_ids" (exact keys: an array of ids, or a batch).
	PromptTokens int64
	// Prompt reports that the body has one of those keys with a value of
	// such a type (its text may be empty); without one, PromptBytes is 0
	// and says nothing of the prompt.
	Prompt bool
	// Media is the parts of the prompt that are not text: each content
	// part of a message or input item without a "text" string (nor a
	// "refusal" or SGLang's "thinking": an image, audio, a file), and each of
	// Ollama's "images" (of a message, or of the body). The backend
	// counts their tokens; PromptBytes does not.
	Media int64
	// Reasoning reports that PromptBytes holds an assistant message's
	// reasoning, which a chat template may leave out of the prompt.
	Reasoning bool
	// Ambiguous reports (SniffEither) that the body names different
	// models as its two kinds of backend read it.
	Ambiguous bool
	// NewTokens is the completion budget of TGI's and SGLang's native
	// /generate: "max_new_tokens" of TGI's "parameters" or of SGLang's
	// "sampling_params" (of any of a batch's list of them), the
	// largest, read as Budget's; 0 if none.
	NewTokens int64
	// NewCompletions is how many completions those generate, each up
	// to NewTokens: the larger of TGI's "parameters": {"best_of"} and
	// SGLang's "sampling_params": {"n"} (else 1), times the prompts of
	// an SGLang batch ("text" an array of strings, "input_ids" of token
	// arrays, "sampling_params" a list of objects, one a prompt),
	// saturated as Completions; 0 (one) if the body has none of these.
	NewCompletions int64
	// AmbiguousStream reports (SniffEither) that one kind of backend
	// streams the answer to the body and the other does not
	// ("stream":false,"STREAM":true).
	AmbiguousStream bool
}

// Sniff reads the top-level keys "stream", "model", the max tokens keys
// and the prompt's text (see Fields) of a JSON object body. Anything else
// (not JSON, malformed JSON, another top-level type) gives the zero
// Fields: the request is then not streaming, has no model, no max tokens
// and no prompt, and is still served. Keys may come in any order; for a
// repeated key the last one counts, as in most JSON parsers. It reads
// keys exactly, as pydantic (vLLM, SGLang) does, and past a UTF-8 byte
// order mark, in UTF-16 and UTF-32, and through NaN, Infinity and
// -Infinity, as Python's json.loads does.
func Sniff(b []byte) Fields { return sniff(b, exactKeys) }

// SniffFolded is Sniff for a backend that reads keys as Go's
// encoding/json does (Ollama's native API): a key is the field it
// equals case-insensitively ("OPTIONS" is "options"), and of a field's
// spellings the last counts. The keys of "options" are matched exactly,
// as Ollama matches them. A byte order mark or a NaN makes the body
// unreadable, as it does to Go.
func SniffFolded(b []byte) Fields { return sniff(b, foldedKeys) }

// SniffEither reads an OpenAI-compatible body as either kind of backend
// may: with Sniff's exact keys (Python's pydantic: vLLM, SGLang) and with
// SniffFolded's keys in any case (Go's encoding/json: Ollama's /v1
// endpoints), since the handler cannot tell which runs it. Each count is
// the heavier reading's, so that no spelling makes a body lighter than
// a backend runs it; a prompt that only one reading finds counts at
// least the body's bytes, as a body without one does. Stream and Model
// are the exact reading's; Ambiguous reports that the other names
// another model, AmbiguousStream that it streams where the exact one
// does not, or the other way round: Go's reading into a bool (Ollama's
// /v1/chat/completions and /v1/completions, a null leaving the value
// before it) or into a *bool (its /v1/responses, a null unsetting it).
// A body that one kind cannot read (a NaN or a byte order mark, which Go
// refuses) is read as the other reads it.
func SniffEither(b []byte) Fields {
	f, fok := sniffRead(b, exactKeys)
	g, gStream, gok := sniffStream(b, foldedKeys)
	switch {
	case !gok:
		return f
	case !fok:
		g.AmbiguousStream = !gStream.refused && g.Stream != gStream.value // a *bool's reading or a bool's
		g.Stream = gStream.value                                          // Ollama's /v1 reads a bool
		return g
	}
	f.Ambiguous = f.Model != g.Model
	// A "stream" that Go refuses (1, "true") has Ollama refuse the body:
	// only the exact reading's backends run it.
	f.AmbiguousStream = !gStream.refused && (f.Stream != gStream.value || f.Stream != g.Stream)
	f.MaxTokens = max(f.MaxTokens, g.MaxTokens)
	f.Budget = max(f.Budget, g.Budget)
	f.Completions = max(f.Completions, g.Completions)
	f.NewTokens = max(f.NewTokens, g.NewTokens)
	f.NewCompletions = max(f.NewCompletions, g.NewCompletions)
	f.PromptTokens = max(f.PromptTokens, g.PromptTokens)
	f.Media = max(f.Media, g.Media)
	f.Reasoning = f.Reasoning || g.Reasoning
	if f.Prompt != g.Prompt {
		f.PromptBytes = max(f.PromptBytes, g.PromptBytes, int64(len(b)))
	} else {
		f.PromptBytes = max(f.PromptBytes, g.PromptBytes)
	}
	f.Prompt = f.Prompt || g.Prompt
	return f
}

// Object reports whether b is a JSON object as Sniff reads one (folded:
// as SniffFolded does): a body of which they read no key otherwise has
// none of theirs.
func Object(b []byte, folded bool) bool {
	if !folded {
		b = bytes.TrimPrefix(b, utf8BOM)
	}
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && valid(b, !folded)
}

func sniff(b []byte, k keys) Fields {
	f, _ := sniffRead(b, k)
	return f
}

// sniffRead is sniff, and whether its reader reads b (a JSON object).
func sniffRead(b []byte, k keys) (Fields, bool) {
	f, _, ok := sniffStream(b, k)
	return f, ok
}

// sniffStream is sniffRead, and "stream" as Go decodes it into a bool
// (goStream); a *bool (Ollama's native requests', its /v1/responses'),
// which Fields.Stream and NoStream read with foldedKeys, is nil after a
// null.
func sniffStream(b []byte, k keys) (info Fields, goBool goStream, ok bool) {
	if k == exactKeys {
		// Python's json.loads takes a UTF-8 byte order mark before the
		// JSON, and UTF-16 and UTF-32 (Go's encoding/json does not).
		if b, ok = pythonText(b); !ok {
			return Fields{}, goStream{}, false
		}
	}
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] != '{' || !valid(b, k == exactKeys) {
		return Fields{}, goStream{}, false
	}
	// b is valid JSON from here on: the scanner only needs to find where
	// each top-level member starts and ends.
	var tokens [4]int64   // by key, so that a repeated key replaces its own value
	var prompts [7]prompt // messages, prompt, system, input, instructions, suffix, template
	var choices [2]int64  // n, best_of
	var generate [2]int64 // /generate: TGI's max_new_tokens, best_of
	var sampling [2]int64 // SGLang's max_new_tokens, n
	var batch [3]int64    // SGLang's prompts: text, input_ids, sampling_params
	var context [2]int64  // token ids: Ollama's "context", SGLang's "input_ids"
	var template rendered // tools, functions, documents, chat_template_kwargs
	var images int64      // Ollama's generate: "images"
	var messages []int    // where the "messages" that count start (messagesText)
	var model []byte      // the "model" string that counts
	eachMember(b, func(key, val []byte) {
		name := k.name(key)
		if k.keepsOnNull(name, val) {
			return
		}
		switch name {
		case "stream":
			info.Stream, info.NoStream = k.stream(val)
			goBool.read(val)
		case "model":
			model = nil // decoded once, the last (modelText)
			if val[0] == '"' {
				model = val
			}
		case "max_tokens":
			tokens[0] = tokenCount(val)
		case "max_completion_tokens":
			tokens[1] = tokenCount(val)
		case "max_output_tokens":
			tokens[2] = tokenCount(val)
		case "n":
			choices[0] = tokenCount(val)
		case "best_of":
			choices[1] = tokenCount(val)
		case "options":
			// Go's encoding/json adds a repeated map's keys to the map
			// it holds (a null empties it); pydantic and Python's json
			// replace it.
			if n, found := numPredict(val); found || k == exactKeys || val[0] == 'n' {
				tokens[3] = n
			}
		case "messages":
			if val[0] != '[' || emptyArray(val) || k == exactKeys {
				messages = messages[:0] // replaced, or decoded afresh
			}
			messages = append(messages, cap(b)-cap(val)) // val lies in b
		case "prompt":
			prompts[1] = promptText(val)
		case "system":
			prompts[2] = stringText(val)
		case "input":
			prompts[3] = inputText(val, k)
		case "instructions":
			prompts[4] = stringText(val)
		case "suffix":
			prompts[5] = stringText(val)
		case "template":
			prompts[6] = stringText(val)
		case "context":
			context[0] = tokenIDs(val)
		case "images":
			images = elements(val)
		case "parameters":
			generate[0], generate[1] = generateParams(val, "best_of")
		case "sampling_params":
			sampling[0], sampling[1], batch[2] = samplingParams(val)
		case "text":
			batch[0] = generateBatch(val)
		case "input_ids":
			batch[1], context[1] = generateBatch(val), inputIDs(val, k)
		case "tools", "functions", "documents", "chat_template_kwargs":
			template.read(name, val, k)
		}
	})
	if len(messages) > 1 && (b[messages[0]] != '[' || emptyArray(b[messages[0]:])) {
		messages = messages[1:] // the arrays after a null or an empty one
	}
	if model != nil {
		info.Model = modelText(model)
	}
	prompts[0] = messagesText(b, messages, k)
	info.MaxTokens = max(tokens[0], tokens[1], tokens[2])
	info.Budget = cmp.Or(tokens[1], tokens[2], tokens[0])
	info.NumPredict = tokens[3]
	if each, batch := max(choices[0], choices[1]), prompts[1].batch; each > 0 || batch > 0 {
		info.Completions = saturatedProduct(max(each, 1), max(batch, 1))
	}
	info.NewTokens = max(generate[0], sampling[0])
	if each, prompts := max(generate[1], sampling[1]), max(batch[0], batch[1], batch[2]); each > 0 || prompts > 0 {
		info.NewCompletions = saturatedProduct(max(each, 1), max(prompts, 1))
	}
	info.PromptTokens = context[0] + context[1]
	info.Media = images
	for _, p := range prompts {
		info.PromptBytes += p.n
		info.PromptTokens += p.ids
		info.Prompt = info.Prompt || p.found
		info.Media += p.media
		info.Reasoning = info.Reasoning || p.reasoning
	}
	if info.Prompt {
		info.PromptBytes += template.bytes()
	}
	return info, goBool, true
}

// scanner walks a valid JSON document.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

// str consumes a string and returns it with its quotes. The body is
// valid JSON: the string ends at the first quote not escaped by an odd
// number of backslashes.
func (s *scanner) str() []byte {
	start := s.i
	s.i++ // opening quote
	for {
		j := bytes.IndexByte(s.b[s.i:], '"')
		if j < 0 {
			s.i = len(s.b)
			return s.b[start:]
		}
		s.i += j + 1
		escapes := 0
		for k := s.i - 2; k > start && s.b[k] == '\\'; k-- {
			escapes++
		}
		if escapes%2 == 0 {
			return s.b[start:s.i]
		}
	}
}

// value consumes one value of any type.
func (s *scanner) value() {
	switch s.peek() {
	case '"':
		s.str()
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				s.str()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				return
			}
		}
	default: // number, true, false, null
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return
			}
			s.i++
		}
	}
}

// maxModelJSON is the most of a "model" string that is decoded: no
// queue name is that long (names are at most 200 bytes; 4 KiB of JSON
// decode to at least 682), so that a model of megabytes names none
// either way, and costs no more than that to decode.
const maxModelJSON = 4 << 10

// modelText decodes a "model" string token, cut to its first
// maxModelJSON bytes of JSON (at a whole character or escape).
func modelText(tok []byte) string {
	inner := tok[1 : len(tok)-1]
	if len(inner) <= maxModelJSON {
		return unquote(tok)
	}
	end := 0
	for end < len(inner) {
		n := 1
		if inner[end] == '\\' {
			n = 2
			if inner[end+1] == 'u' {
				n = 6
			}
		}
		if end+n > maxModelJSON {
			break
		}
		end += n
	}
	cut := make([]byte, 0, end+2)
	cut = append(append(append(cut, '"'), inner[:end]...), '"')
	return unquote(cut)
}

// unquote decodes a JSON string token (quotes included).
func unquote(tok []byte) string {
	if inner := tok[1 : len(tok)-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner)
	}
	// encoding/json makes each invalid UTF-8 byte a U+FFFD.
	var s string
	_ = json.Unmarshal(tok, &s)
	return s
}
