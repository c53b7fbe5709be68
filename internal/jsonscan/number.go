package jsonscan

import (
	"math"
	"strconv"
)

// maxDecimalDigits is how many digits of a mantissa strconv.ParseFloat
// keeps (its decimal's buffer); a number of at most that many bytes has
// no more digits than that, which it reads right.
const maxDecimalDigits = 800

// parseFloat reads a decimal number (a JSON number token, or a token
// count's digits sent as a string) as Python's float() does, correctly
// rounded whatever its length. strconv.ParseFloat keeps only the first
// 800 digits of a mantissa and, when more come before the decimal point,
// loses their place: it reads 1 followed by 5000 zeros and e-5000 as 0,
// where Python reads 1.0. A longer number is therefore first written
// with its significant digits after the point (0.d...e±x), cut to
// maxDecimalDigits of them and a last nonzero digit standing for any
// cut that is not all zeros, which rounds as the whole does. Anything
// that is not such a number is strconv.ParseFloat's to read (NaN,
// Infinity) or refuse, as are its errors (ErrRange for 1e999).
func parseFloat(num string) (float64, error) {
	if len(num) <= maxDecimalDigits {
		return strconv.ParseFloat(num, 64)
	}
	i, neg := 0, false
	if num[0] == '+' || num[0] == '-' {
		neg, i = num[0] == '-', 1
	}
	intStart := i
	i = skipDigits(num, i)
	intDigits := num[intStart:i]
	var frac string
	if i < len(num) && num[i] == '.' {
		fracStart := i + 1
		i = skipDigits(num, fracStart)
		frac = num[fracStart:i]
	}
	if len(intDigits)+len(frac) == 0 {
		return strconv.ParseFloat(num, 64)
	}
	var exp int64
	if i < len(num) && (num[i] == 'e' || num[i] == 'E') {
		i++
		expNeg := false
		if i < len(num) && (num[i] == '+' || num[i] == '-') {
			expNeg, i = num[i] == '-', i+1
		}
		expStart := i
		for ; i < len(num) && num[i] >= '0' && num[i] <= '9'; i++ {
			if exp < 1e9 { // far past any float64; no overflow
				exp = exp*10 + int64(num[i]-'0')
			}
		}
		if i == expStart {
			return strconv.ParseFloat(num, 64)
		}
		if expNeg {
			exp = -exp
		}
	}
	if i != len(num) {
		return strconv.ParseFloat(num, 64)
	}
	// The value is 0.(intDigits frac) × 10^(len(intDigits)+exp); each
	// leading zero dropped lowers the exponent by one.
	exp += int64(len(intDigits))
	digits := make([]byte, 0, maxDecimalDigits+len("-0.1e-1000000000"))
	if neg {
		digits = append(digits, '-')
	}
	digits = append(digits, '0', '.')
	start := len(digits)
	cut := false
	for _, part := range [2]string{intDigits, frac} {
		for j := 0; j < len(part); j++ {
			c := part[j]
			switch {
			case len(digits) == start && c == '0':
				exp--
			case len(digits)-start < maxDecimalDigits:
				digits = append(digits, c)
			case c != '0':
				cut = true
			}
		}
	}
	if len(digits) == start {
		if neg {
			return math.Copysign(0, -1), nil
		}
		return 0, nil
	}
	if cut {
		digits = append(digits, '1')
	}
	digits = append(digits, 'e')
	digits = strconv.AppendInt(digits, exp, 10)
	return strconv.ParseFloat(string(digits), 64)
}

// skipDigits is the index of the first byte of s from i on that is not
// a decimal digit.
func skipDigits(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// goTokenCount is tokenCount for a number that Go's encoding/json
// decodes into an interface (Ollama's "options" map), as Ollama then
// reads it: the float64 of strconv.ParseFloat, which a long mantissa can
// make far smaller than its value (parseFloat), truncated (int64(t):
// 2.9 is 2, 0.5 is 0, which Ollama takes for no limit, and so none).
func goTokenCount(val []byte) int64 {
	if len(val) > 0 && (val[0] == '-' || val[0] >= '0' && val[0] <= '9') {
		f, err := strconv.ParseFloat(string(val), 64)
		return positiveFloat(math.Trunc(f), err)
	}
	return tokenCount(val)
}
