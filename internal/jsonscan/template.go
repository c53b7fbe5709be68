package jsonscan

// What a chat template renders into the prompt besides the messages:
// the top-level keys whose JSON the weight counts as the prompt's text.

// rendered is the bytes of JSON of each top-level key a chat template
// renders into the prompt, by renderedKey.
type rendered [4]int64

// renderedKey is where read counts a key of the body: "tools" and
// "functions" (the definitions of the tools a model may call: vLLM,
// SGLang, Ollama), "documents" (vLLM's chat request: a RAG request's
// documents, which a template that supports them renders) and
// "chat_template_kwargs" (vLLM's and SGLang's: values handed to the
// template, which some templates render, such as a system prompt's
// text or a date).
func renderedKey(name string) int {
	switch name {
	case "tools":
		return 0
	case "functions":
		return 1
	case "documents":
		return 2
	case "chat_template_kwargs":
		return 3
	}
	return -1
}

// read counts val, the value of the top-level key name (a renderedKey),
// as k reads it: "tools" and "functions" as toolsAgain does; "documents"
// (an array) and "chat_template_kwargs" (an object) only with exactKeys,
// as pydantic reads them (Ollama, Go's encoding/json, reads neither).
// The last of a repeated key counts.
func (r *rendered) read(name string, val []byte, k keys) {
	switch i := renderedKey(name); i {
	case 0, 1:
		r[i] = toolsAgain(r[i], val, k)
	case 2:
		if k == exactKeys {
			r[i] = toolsText(val)
		}
	case 3:
		if r[i] = 0; k == exactKeys && val[0] == '{' {
			r[i] = int64(len(val))
		}
	}
}

// bytes is the JSON of every key counted.
func (r *rendered) bytes() int64 { return r[0] + r[1] + r[2] + r[3] }

// elements is the number of elements of an array (Ollama's "images": an
// image each), 0 for another value.
func elements(val []byte) int64 {
	var n int64
	if val[0] == '[' {
		eachElement(val, func([]byte) { n++ })
	}
	return n
}

// inputIDs is the token ids of SGLang's "input_ids" as k reads it: the
// numbers of an array, or of a batch of arrays; with foldedKeys none
// (Ollama reads no such key). SGLang's chat request runs them instead of
// the messages the chat template renders (a client's own rendering), its
// native /generate as the prompts.
func inputIDs(val []byte, k keys) int64 {
	if k != exactKeys || val[0] != '[' {
		return 0
	}
	return promptText(val).ids
}
