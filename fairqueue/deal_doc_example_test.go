package fairqueue

import "testing"

// The example of docs/failures.md ("the excess comes off what each
// instance held"): permits 12 over 3 instances holding 4, 4 and 6 (14:
// an excess of 2) give shares of 2, 2 and 4.
func TestDealOfAnExcessAsDocumented(t *testing.T) {
	held := []int{4, 4, 6}
	for r, want := range []int{2, 2, 4} {
		if got := deal(12, 14, 0, held, r, 3); got != want {
			t.Errorf("rank %d: share %d, the docs say %d", r, got, want)
		}
	}
}
