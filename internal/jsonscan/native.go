package jsonscan

// TGI's and SGLang's native /generate set a request's budget and
// completions in an object of their own: TGI's "parameters" (Rust's
// serde: exact keys) and SGLang's "sampling_params" (pydantic: exact
// keys), each with "max_new_tokens"; TGI's best_of and SGLang's n
// generate that many completions each, and SGLang takes a batch of
// prompts in "text" or "input_ids", with one "sampling_params" for all
// or a list of them, one for each prompt.

// generateParams reads "max_new_tokens" and the completions key of such
// an object (its keys exact, whichever reading reads the body), each as
// tokenCount reads a count: 0 for a value that is not an object, or a
// key not in it.
func generateParams(val []byte, completionsKey string) (newTokens, completions int64) {
	if val[0] != '{' {
		return 0, 0
	}
	eachMember(val, func(key, v []byte) {
		switch {
		case exactKeys.is(key, "max_new_tokens"):
			newTokens = tokenCount(v)
		case exactKeys.is(key, completionsKey):
			completions = tokenCount(v)
		}
	})
	return newTokens, completions
}

// samplingParams is generateParams of SGLang's "sampling_params": an
// object, or a batch's list of them, one for each prompt, of which the
// heaviest counts for each count; prompts is the list's length (0 for
// an object), which SGLang requires to be the batch's.
func samplingParams(val []byte) (newTokens, completions, prompts int64) {
	if val[0] != '[' {
		newTokens, completions = generateParams(val, "n")
		return newTokens, completions, 0
	}
	eachElement(val, func(el []byte) {
		t, n := generateParams(el, "n")
		newTokens, completions = max(newTokens, t), max(completions, n)
		prompts++
	})
	return newTokens, completions, prompts
}

// generateBatch is the prompts of an SGLang batch: "text" an array of
// strings, or "input_ids" an array of token arrays (0 for one prompt).
func generateBatch(val []byte) int64 {
	if val[0] != '[' {
		return 0
	}
	return promptText(val).batch
}
