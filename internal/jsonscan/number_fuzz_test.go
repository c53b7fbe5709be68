package jsonscan

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseFloatRoundsExactly checks parseFloat against the nearest
// float64 of the number's exact value (math/big's rational), as
// Python's float() reads it, for numbers of any length: a mantissa of
// up to thousands of digits, before or after the point, and an
// exponent that brings it back into range.
func FuzzParseFloatRoundsExactly(f *testing.F) {
	f.Add(false, "1", uint16(5000), "", int16(-5000))
	f.Add(false, "9", uint16(0), strings.Repeat("9", 900), int16(1))
	f.Add(true, "1", uint16(900), "5", int16(-900))
	f.Add(false, "10000000000000000111022302462515654042363166015625", uint16(900), "", int16(-949))
	f.Add(false, "0", uint16(0), strings.Repeat("0", 900)+"1", int16(901))
	f.Add(false, "2", uint16(3000), "", int16(-2700))
	f.Fuzz(func(t *testing.T, neg bool, lead string, zeros uint16, frac string, exp int16) {
		lead = strings.TrimLeft(digitsOnly(lead), "0")
		if lead == "" {
			lead = "0"
		}
		mant := lead + strings.Repeat("0", int(zeros%6000))
		num := mant
		if frac = digitsOnly(frac); frac != "" {
			num += "." + frac
		}
		num += "e" + strconv.Itoa(int(exp))
		if neg {
			num = "-" + num
		}
		// The exact value: big.Rat reads the exponent as a power of ten.
		want := math.Inf(1)
		if r, ok := new(big.Rat).SetString(num); ok {
			want, _ = r.Float64()
		}
		got, err := parseFloat(num)
		if err != nil && !strings.Contains(err.Error(), "range") {
			t.Fatalf("parseFloat(%.60s…): %v", num, err)
		}
		if math.IsInf(got, 0) && !math.IsInf(want, 0) && math.Abs(want) > math.MaxFloat64/2 {
			return // big.Rat's Float64 of an overflow is MaxFloat64
		}
		if got != want && !(math.IsInf(got, 0) && math.Abs(want) == math.MaxFloat64) {
			t.Fatalf("parseFloat(%.60s… (%d bytes)) = %v, want %v", num, len(num), got, want)
		}
	})
}

// digitsOnly keeps the decimal digits of s.
func digitsOnly(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
}
