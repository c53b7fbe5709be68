package jsonscan

import (
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// pythonFloat is the fuzz oracles' reading of a decimal number as
// Python's float() reads it: math/big's, rounded once to a float64,
// whatever the number's length (strconv.ParseFloat misreads a mantissa
// of more than 800 digits). A number past float64's range is an
// ErrRange, as strconv's.
func pythonFloat(s string) (float64, error) {
	f, _, err := big.ParseFloat(s, 10, 53, big.ToNearestEven)
	if err != nil {
		// An exponent past what math/big takes: the value is 0, or
		// past any float64, as the mantissa is 0 or not.
		mant, exp, found := strings.Cut(strings.ToLower(s), "e")
		m, _, merr := big.ParseFloat(mant, 10, 53, big.ToNearestEven)
		switch {
		case !found || merr != nil:
			return 0, &strconv.NumError{Func: "pythonFloat", Num: s, Err: strconv.ErrSyntax}
		case m.Sign() == 0 || strings.HasPrefix(exp, "-"):
			return 0, nil
		}
		return math.Inf(m.Sign()), &strconv.NumError{Func: "pythonFloat", Num: s, Err: strconv.ErrRange}
	}
	v, _ := f.Float64()
	if f.IsInf() || math.IsInf(v, 0) {
		return v, &strconv.NumError{Func: "pythonFloat", Num: s, Err: strconv.ErrRange}
	}
	return v, nil
}

// wantPydanticBool is the fuzz oracle's reading of a "stream" value as
// pydantic's lax bool reads it (vLLM, SGLang): true and false; a number
// equal to 1 or 0; a string that is "1" or "0" or, in any ASCII letter
// case, one of true, t, yes, y, on and false, f, no, n, off. stream and
// noStream are both false for anything else (absent, null, refused).
func wantPydanticBool(raw json.RawMessage) (stream, noStream bool) {
	var v any
	d := json.NewDecoder(strings.NewReader(string(raw)))
	d.UseNumber()
	if len(raw) == 0 || d.Decode(&v) != nil {
		return false, false
	}
	switch v := v.(type) {
	case bool:
		return v, !v
	case json.Number:
		f, err := pythonFloat(string(v))
		return err == nil && f == 1, err == nil && f == 0
	case string:
		lower := []byte(v)
		for i, c := range lower {
			if c >= 'A' && c <= 'Z' {
				lower[i] = c + 'a' - 'A'
			}
		}
		switch string(lower) {
		case "1", "true", "t", "yes", "y", "on":
			return true, false
		case "0", "false", "f", "no", "n", "off":
			return false, true
		}
	}
	return false, false
}
