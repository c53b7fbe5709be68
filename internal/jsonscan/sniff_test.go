package jsonscan

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSniffReadsTopLevelStreamAndModel(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Fields
	}{
		{"stream true", `{"model":"m","stream":true}`, Fields{Stream: true, Model: "m"}},
		{"stream false", `{"stream":false,"model":"m"}`, Fields{NoStream: true, Model: "m"}},
		{"stream missing", `{"model":"gpt-4o","messages":[]}`, Fields{Model: "gpt-4o", Prompt: true}},
		{"stream first, model last", `{"stream":true,"messages":[{"role":"user","content":"hi"}],"model":"llama"}`, Fields{Stream: true, Model: "llama", PromptBytes: 2, Prompt: true}},
		{"whitespace everywhere", " \n\t{ \"stream\" :\n true , \"model\" : \"m\" }\n", Fields{Stream: true, Model: "m"}},
		{"nested stream ignored", `{"options":{"stream":true},"messages":[{"stream":true}]}`, Fields{Prompt: true}},
		{"nested model ignored", `{"meta":{"model":"x"}}`, Fields{}},
		{"stream as string, as pydantic reads it", `{"stream":"true"}`, Fields{Stream: true}},
		{"stream as number, as pydantic reads it", `{"stream":1}`, Fields{Stream: true}},
		{"stream as a string pydantic refuses", `{"stream":"sure"}`, Fields{}},
		{"model not a string", `{"model":42,"stream":true}`, Fields{Stream: true}},
		{"model with escapes", `{"model":"a\"b\\c\u00e9"}`, Fields{Model: "a\"b\\c\u00e9"}},
		{"escaped key", `{"str\u0065am":true}`, Fields{Stream: true}},
		{"strings holding braces and quotes", `{"prompt":"} { \" ] [","stream":true}`, Fields{Stream: true, PromptBytes: 9, Prompt: true}},
		{"string ending in an escaped backslash", `{"x":"a\\","model":"m"}`, Fields{Model: "m"}},
		{"string ending in a backslash, then an escaped quote", `{"x":"a\\\"","model":"m"}`, Fields{Model: "m"}},
		{"model ending in an escaped backslash", `{"model":"m\\","stream":true}`, Fields{Stream: true, Model: "m\\"}},
		{"duplicate key: last wins", `{"stream":true,"stream":false}`, Fields{NoStream: true}},
		{"duplicate model: last wins", `{"model":"a","model":"b"}`, Fields{Model: "b"}},
		{"empty object", `{}`, Fields{}},
		{"empty body", ``, Fields{}},
		{"array", `[{"stream":true}]`, Fields{}},
		{"malformed: truncated", `{"stream":true,"model":"m"`, Fields{}},
		{"malformed: bad literal", `{"stream":true,"x":tru}`, Fields{}},
		{"malformed: trailing garbage", `{"stream":true} x`, Fields{}},
		{"not JSON", `stream=true&model=m`, Fields{}},
		{"multipart", "--boundary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--boundary--", Fields{}},
		{"numbers and nulls", `{"n":-1.5e3,"z":null,"t":true,"stream":true,"a":[1,2,{"b":[]}]}`, Fields{Stream: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Sniff([]byte(tc.body)))
		})
	}
}

func TestSniffReadsTheLargestTopLevelMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"max_tokens", `{"model":"m","max_tokens":512}`, 512},
		{"max_completion_tokens", `{"max_completion_tokens":1024,"model":"m"}`, 1024},
		{"max_output_tokens (Responses API)", `{"input":"hi","max_output_tokens":300}`, 300},
		{"several keys: the largest", `{"max_tokens":10,"max_completion_tokens":2000,"max_output_tokens":30}`, 2000},
		{"absent", `{"model":"m"}`, 0},
		{"nested is ignored", `{"options":{"max_tokens":99},"messages":[{"max_tokens":5}]}`, 0},
		{"zero", `{"max_tokens":0}`, 0},
		{"negative", `{"max_tokens":-5}`, 0},
		{"string of digits", `{"max_tokens":"512"}`, 512},
		{"other string", `{"max_tokens":"many"}`, 0},
		{"null", `{"max_tokens":null}`, 0},
		{"fraction rounds up", `{"max_tokens":10.2}`, 11},
		{"exponent", `{"max_tokens":1e3}`, 1000},
		{"huge saturates", `{"max_tokens":1e999}`, MaxTokenCount},
		{"duplicate key: last wins", `{"max_tokens":900,"max_tokens":9}`, 9},
		{"after a large prompt", `{"messages":[{"content":"` + strings.Repeat("x", 1<<16) + `"}],"max_tokens":77}`, 77},
		{"malformed JSON", `{"max_tokens":512`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Sniff([]byte(tc.body)).MaxTokens)
		})
	}
}

func TestSniffFindsStreamAfterAMebibyteOfMessages(t *testing.T) {
	content := strings.Repeat("x", 1<<20)
	body := `{"messages":[{"role":"user","content":"` + content + `"}],"model":"m","stream":true}`
	assert.Equal(t, Fields{Stream: true, Model: "m", PromptBytes: 1 << 20, Prompt: true}, Sniff([]byte(body)))
}

// FuzzSniff checks the scanner against encoding/json: for every
// input that is a JSON object, Sniff reads what a JSON parser reads.
func FuzzSniff(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","stream":true}`, `{"stream":false}`, `{"a":{"stream":true}}`,
		`{"str\u0065am":true}`, `{"model":"\"}"}`, `[1]`, `{"stream":true`, `{}`, ` {"a":[{}],"stream" : true } `,
		`{"max_tokens":12,"max_completion_tokens":1.5e2}`, `{"max_output_tokens":-1}`, `{"max_tokens":"9"}`,
		`{"max_tokens":" +1_0.0 "}`, `{"max_completion_tokens":"x1","max_tokens":"1e3"}`,
		`{"x":"a\\","model":"m"}`, `{"x":"a\\\"","model":"m"}`,
		`{"messages":[{"role":"user","content":"h\u00e9\ud83d\ude00\n"},{"content":[{"type":"text","text":"x"},"y",{"text":1}]}]}`,
		`{"prompt":["ab","\ud800x"],"system":"s\xff","options":{"num_predict":64},"max_tokens":0}`,
		`{"prompt":"p","messages":null,"system":3,"options":{"num_predict":-1}}`,
		"{\"prompt\":\"\xed\xa0\x80\\udc00\\u0041\"}",
		`{"input":["a\u00e9",{"role":"user","content":[{"type":"input_text","text":"xyz"}]},{"content":"q"},3]}`,
		`{"input":"embed me","model":"e"}`,
		`{"prompt":["a",[1,2],3],"n":"4","best_of":2}`, `{"n":2,"prompt":[1,2]}`, `{"suffix":"ab","template":"{{ .Prompt }}","prompt":""}`,
		`{"messages":[{"tool_calls":[ {"a":"b"} ],"content":"x"}],"tools":[1, 2],"functions":{}}`,
		`{"input":[{"type":"function_call","arguments":"{}"},{"arguments":3}],"tools":[]}`,
		`{"prompt":[[1,-2],3,"x",[[4]]],"input":[[5],6,{"content":"c"}],"context":[7,8.5,null]}`,
		`{"messages":[{"content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
		`{"messages":[{"content":"x","images":["aGk="]},{"content":"y","images":[]}]}`, `{"prompt":"p","images":["aGk="]}`,
		`{"input":[{"content":[{"type":"input_image","image_url":"u"}]},{"output":[{"text":"t"}]}],"images":[]}`,
		`{"messages":[{"content":[{"type":"refusal","refusal":"no"},{"refusal":1},{"text":1,"refusal":"r"},{"refusal":"r","text":"t"}]}]}`,
		`{"input":[{"type":"message","content":[{"type":"refusal","refusal":"n\u00f6"}]}]}`,
		`{"messages":[{"content":[{"type":"tool_reference","name":"f"},{"type":"image_url","type":"tool_reference"},{"type":"tool_reference","type":"x"},{"type":"tool\u005freference"}]}]}`,
		`{"messages":[{"content":"c","reasoning":"rr","reasoning_content":"r","thinking":"t"},{"reasoning_content":"rc","reasoning":null}]}`,
		`{"messages":[{"content":[{"type":"thinking","thinking":"th"},{"thinking":1},{"refusal":"r","thinking":"tt"},{"type":"reasoning","text":"x","thinking":"yy"}]}]}`,
		`{"messages":[{"content":"x"}],"documents":[{"title":"t","text":"d"}],"chat_template_kwargs":{"a":"b"},"documents":null}`,
		`{"messages":[{"content":[{"type":"image_url"},{"type":"input_audio"},"t"],"images":["a","b"]}],"images":["c"]}`,
		`{"messages":[],"input_ids":[1,"4",5.5],"input_ids":[6,7]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := Sniff(b)
		folded := SniffFolded(b) // never panics; not JSON: the zero Fields too
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil || m == nil {
			assert.Equal(t, Fields{}, folded)
		}
		// Sniff reads past a UTF-8 byte order mark, and UTF-16 and UTF-32,
		// as Python does (TestSniffReadsAUTF16OrUTF32BodyAsPythonDoes).
		m = nil
		text, ok := pythonText(b)
		if !ok || json.Unmarshal(text, &m) != nil || m == nil {
			if !ok || !ValidPython(text) { // NaN and the like: TestValidPythonAndSniffReadNaNAndInfinity
				assert.Equal(t, Fields{}, got)
			}
			return
		}
		var want Fields
		want.Stream, want.NoStream = wantPydanticBool(m["stream"])
		var model string
		if json.Unmarshal(m["model"], &model) == nil {
			want.Model = model
		}
		for _, k := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
			want.MaxTokens = max(want.MaxTokens, wantTokens(m[k]))
		}
		want.Budget = cmp.Or(wantTokens(m["max_completion_tokens"]), wantTokens(m["max_output_tokens"]), wantTokens(m["max_tokens"]))
		if opts, ok := wantObject(m["options"]); ok {
			want.NumPredict = wantGoTokens(opts["num_predict"])
		}
		want.PromptBytes, want.Prompt = wantPrompt(m)
		want.Completions = wantCompletions(m)
		want.PromptTokens = wantPromptTokens(m)
		want.Media = wantMedia(m)
		want.Reasoning = wantReasoning(m)
		// Native /generate's budget and completions (TGI's "parameters",
		// SGLang's "sampling_params" and batches of "text" and
		// "input_ids") are not this oracle's: kv_native_generate_test.go
		// checks them.
		got.NewTokens, got.NewCompletions = 0, 0
		assert.Equal(t, want, got, "body %q", b)
	})
}

// wantPrompt is the fuzz oracle's reading of the prompt's text, decoded
// by encoding/json: see Fields.PromptBytes.
func wantPrompt(m map[string]json.RawMessage) (n int64, found bool) {
	if msgs, ok := wantArray(m["messages"]); ok {
		found = true
		for _, msg := range msgs {
			if o, ok := wantObject(msg); ok {
				n += wantContent(o["content"]) + wantJSONArray(o["tool_calls"])
				reasoning, _ := wantString(o["reasoning"])
				content, _ := wantString(o["reasoning_content"])
				n += int64(max(len(reasoning), len(content)))
			}
		}
	}
	if s, ok := wantString(m["prompt"]); ok {
		n, found = n+int64(len(s)), true
	}
	if batch, ok := wantArray(m["prompt"]); ok {
		found = true
		for _, el := range batch {
			s, _ := wantString(el)
			n += int64(len(s))
		}
	}
	if s, ok := wantString(m["system"]); ok {
		n, found = n+int64(len(s)), true
	}
	for _, key := range []string{"instructions", "suffix", "template"} {
		if s, ok := wantString(m[key]); ok {
			n, found = n+int64(len(s)), true
		}
	}
	if s, ok := wantString(m["input"]); ok {
		n, found = n+int64(len(s)), true
	}
	if items, ok := wantArray(m["input"]); ok {
		found = true
		for _, item := range items {
			if s, ok := wantString(item); ok {
				n += int64(len(s))
			}
			if o, ok := wantObject(item); ok {
				n += wantContent(o["content"]) + wantContent(o["output"])
				if _, ok := wantString(o["arguments"]); ok {
					n += int64(len(item))
				}
			}
		}
	}
	if found {
		n += wantJSONArray(m["tools"]) + wantJSONArray(m["functions"]) + wantJSONArray(m["documents"])
		if _, ok := wantObject(m["chat_template_kwargs"]); ok {
			n += int64(len(bytes.TrimSpace(m["chat_template_kwargs"])))
		}
	}
	return n, found
}

// wantMedia is the fuzz oracle's count of a prompt's parts that are not
// text: see Fields.Media.
func wantMedia(m map[string]json.RawMessage) int64 {
	media := wantElements(m["images"])
	msgs, _ := wantArray(m["messages"])
	for _, msg := range msgs {
		if o, ok := wantObject(msg); ok {
			media += wantMediaParts(o["content"]) + wantElements(o["images"])
		}
	}
	items, _ := wantArray(m["input"])
	for _, item := range items {
		if o, ok := wantObject(item); ok {
			media += wantMediaParts(o["content"]) + wantMediaParts(o["output"])
		}
	}
	return media
}

// wantReasoning is the fuzz oracle's Fields.Reasoning: a message has a
// non-empty "reasoning" or "reasoning_content" string.
func wantReasoning(m map[string]json.RawMessage) bool {
	msgs, _ := wantArray(m["messages"])
	for _, msg := range msgs {
		if o, ok := wantObject(msg); ok {
			reasoning, _ := wantString(o["reasoning"])
			content, _ := wantString(o["reasoning_content"])
			if reasoning != "" || content != "" {
				return true
			}
		}
	}
	return false
}

// wantMediaParts counts a content array's object parts without a "text"
// string, a "refusal" one nor a "thinking" one, but tool references.
func wantMediaParts(raw json.RawMessage) int64 {
	var n int64
	parts, _ := wantArray(raw)
	for _, part := range parts {
		if po, ok := wantObject(part); ok {
			typ, _ := wantString(po["type"])
			if _, ok := wantPartText(po); !ok && typ != "tool_reference" {
				n++
			}
		}
	}
	return n
}

// wantElements counts an array's elements.
func wantElements(raw json.RawMessage) int64 {
	a, _ := wantArray(raw)
	return int64(len(a))
}

// wantJSONArray is the fuzz oracle's length of an array's JSON (tools,
// tool calls), 0 for another value.
func wantJSONArray(raw json.RawMessage) int64 {
	if _, ok := wantArray(raw); !ok {
		return 0
	}
	return int64(len(bytes.TrimSpace(raw)))
}

// wantContent is the oracle's text of a message's content: a string, or
// the string parts and the "text" (else "refusal") of the object parts
// of an array.
func wantContent(raw json.RawMessage) int64 {
	if s, ok := wantString(raw); ok {
		return int64(len(s))
	}
	var n int64
	parts, _ := wantArray(raw)
	for _, part := range parts {
		if s, ok := wantString(part); ok {
			n += int64(len(s))
		}
		if po, ok := wantObject(part); ok {
			s, _ := wantPartText(po)
			n += int64(len(s))
		}
	}
	return n
}

// wantPartText is the oracle's text of an object part: its "text"
// string, else the longer of its "refusal" string (a refusal part) and
// its "thinking" one (SGLang's thinking part).
func wantPartText(po map[string]json.RawMessage) (string, bool) {
	if s, ok := wantString(po["text"]); ok {
		return s, true
	}
	r, rok := wantString(po["refusal"])
	if th, ok := wantString(po["thinking"]); ok && (!rok || len(th) > len(r)) {
		return th, true
	}
	return r, rok
}

func wantString(raw json.RawMessage) (string, bool) {
	var s string
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func wantArray(raw json.RawMessage) ([]json.RawMessage, bool) {
	var a []json.RawMessage
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &a) != nil {
		return nil, false
	}
	return a, true
}

func wantObject(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var o map[string]json.RawMessage
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &o) != nil {
		return nil, false
	}
	return o, true
}

// wantTokens is the fuzz oracle's reading of a max tokens value: a
// positive JSON number, or a string of one in decimal digits (spaces
// around, a plus sign, underscores and a point allowed), rounded up and
// saturated; each number read as Python reads it (pythonFloat).
func wantTokens(raw json.RawMessage) int64 { return wantTokensRead(raw, pythonFloat) }

// wantGoTokens is wantTokens for Ollama's num_predict, whose JSON number
// Go reads with strconv.ParseFloat and Ollama truncates.
func wantGoTokens(raw json.RawMessage) int64 {
	return wantTokensRead(raw, func(s string) (float64, error) {
		f, err := strconv.ParseFloat(s, 64)
		return math.Trunc(f), err
	})
}

// wantTokensRead is wantTokens, a JSON number read by number.
func wantTokensRead(raw json.RawMessage, number func(string) (float64, error)) int64 {
	var n json.Number
	var s string
	parse := number
	if json.Unmarshal(raw, &s) == nil {
		parse = pythonFloat
		s = strings.TrimPrefix(strings.TrimSpace(s), "+")
		if s == "" || strings.Trim(s, "0123456789_.") != "" || s[0] == '_' || s[0] == '.' {
			return 0
		}
		n = json.Number(strings.ReplaceAll(s, "_", ""))
	} else if len(raw) == 0 || json.Unmarshal(raw, &n) != nil {
		return 0
	}
	f, err := parse(string(n))
	if (err != nil && !errors.Is(err, strconv.ErrRange)) || !(f > 0) {
		return 0
	}
	return int64(math.Ceil(min(f, MaxTokenCount)))
}

// BenchmarkSniff reads the top-level keys of chat requests of LLM
// sizes (the rest of the body is skipped, not decoded).
func BenchmarkSniff(b *testing.B) { benchmarkSniff(b, Sniff) }

// BenchmarkSniffEither is BenchmarkSniff read both ways, as an
// OpenAI-compatible path's body is (api.sniff).
func BenchmarkSniffEither(b *testing.B) { benchmarkSniff(b, SniffEither) }

func benchmarkSniff(b *testing.B, sniff func([]byte) Fields) {
	for _, kib := range []int{1, 32} {
		// Prose as clients send it: an escape every 32 bytes or so.
		text := strings.Repeat("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod \\\"tempor\\\" incididunt.\\n", 6)
		msg := strings.Repeat(`{"role":"user","content":"`+text+`"},`, kib*1024/(len(text)+30)+1)
		body := []byte(`{"model":"m","messages":[` + msg[:len(msg)-1] + `],"stream":true,"max_tokens":256}`)
		b.Run(fmt.Sprintf("%.1fKiB", float64(len(body))/1024), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if info := sniff(body); !info.Stream || info.MaxTokens != 256 {
					b.Fatalf("sniffed %+v", info)
				}
			}
		})
	}
}

// A "model" is decoded once, the last one, and a huge one from its
// first maxModelJSON bytes of JSON, cut at a whole escape: no queue name
// is that long, and the name it gives is longer than any.
func TestSniffDecodesTheLastModelCutAtMaxModelJSON(t *testing.T) {
	assert.Equal(t, "b", Sniff([]byte(`{"model":"a","model":"b"}`)).Model)
	assert.Equal(t, "b", SniffFolded([]byte(`{"model":"b","MODEL":null}`)).Model, "Go keeps a string on null")
	assert.Equal(t, "", Sniff([]byte(`{"model":"b","model":null}`)).Model)

	long := strings.Repeat("a", maxModelJSON-1) + `\u00e9` + strings.Repeat("b", 100)
	m := Sniff([]byte(`{"model":"` + long + `"}`)).Model
	assert.Equal(t, strings.Repeat("a", maxModelJSON-1), m, "cut before the escape that crosses the bound")
	m = Sniff([]byte(`{"model":"` + strings.Repeat(`\u0061`, 1000) + `"}`)).Model
	assert.Equal(t, strings.Repeat("a", maxModelJSON/6), m)
	assert.Greater(t, len(m), 200, "longer than any queue name")
	assert.Equal(t, "\ufffd", Sniff([]byte("{\"model\":\"\xff\"}")).Model, "an invalid byte as Go decodes it")
	assert.Equal(t, int64(0), Sniff([]byte("{\"n\":\"1\xff\"}")).Completions)
	assert.Equal(t, int64(12), Sniff([]byte(`{"n":" 1_2 "}`)).Completions)
}
