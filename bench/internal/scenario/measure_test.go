package scenario

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestUtilization(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		busyMS  float64
		permits int
		elapsed float64
		want    float64
	}{
		{8000, 8, 1, 1},
		{4000, 8, 1, 0.5},
		{320_000, 8, 50, 0.8},
		{100, 0, 1, 0},
		{100, 4, 0, 0},
	} {
		assert.Equal(t, c.want, Utilization(c.busyMS, c.permits, c.elapsed), "%+v", c)
	}
}
