package jsonscan

// Token counts read from a body: a budget, n, best_of.

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxTokenCount saturates a token count read from a body: beyond it a
// float64 no longer holds every integer, and every cost bound is far
// below it.
const MaxTokenCount = 1 << 53

// tokenCount reads a JSON number token, or a string of decimal digits,
// as a positive token count, 0 for anything else (another string, null,
// zero, a negative number).
func tokenCount(val []byte) int64 {
	if len(val) > 0 && val[0] == '"' {
		if !utf8.Valid(val) {
			return 0 // an invalid byte decodes as U+FFFD: not a count
		}
		return tokenCountText(unquote(val))
	}
	if len(val) == 0 || (val[0] != '-' && (val[0] < '0' || val[0] > '9')) {
		return 0
	}
	return positiveCount(string(val))
}

// tokenCountText reads a token count sent as a string as vLLM and
// SGLang read it (pydantic takes " 100000 ", "+1_000" or "100.0" for an
// integer, and the backend generates that many): spaces around, a plus
// sign, then digits, underscores and a decimal point; 0 for anything
// else.
func tokenCountText(s string) int64 {
	s = strings.TrimPrefix(strings.TrimSpace(s), "+")
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && c != '_' && c != '.' {
			return 0
		}
	}
	return positiveCount(strings.ReplaceAll(s, "_", ""))
}

// positiveCount parses a decimal number as a positive token count:
// rounded up, saturated at MaxTokenCount; 0 when it is not one.
func positiveCount(num string) int64 {
	return positiveFloat(parseFloat(num))
}

// positiveFloat is a parsed number as a positive token count: rounded
// up, saturated at MaxTokenCount; 0 when it is not one.
func positiveFloat(f float64, err error) int64 {
	if err != nil && !errors.Is(err, strconv.ErrRange) { // 1e999 saturates
		return 0
	}
	if !(f > 0) {
		return 0
	}
	return int64(math.Ceil(min(f, MaxTokenCount)))
}

// saturatedProduct is a*b, both in 1..MaxTokenCount, saturated at
// MaxTokenCount.
func saturatedProduct(a, b int64) int64 {
	if a > MaxTokenCount/b {
		return MaxTokenCount
	}
	return min(a*b, MaxTokenCount)
}
