package report

// Units: the report's figures are milliseconds and seconds as float64,
// rounded to a few digits.

import (
	"math"
	"time"
)

// MSOf returns d in milliseconds, rounded to the microsecond.
func MSOf(d time.Duration) float64 { return Round(float64(d)/float64(time.Millisecond), 3) }

// MS returns ms milliseconds as a duration.
func MS(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// Secs returns s seconds as a duration.
func Secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Round rounds v to digits decimal digits.
func Round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}
