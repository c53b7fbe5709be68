package configs

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestConfigSpecsPairEveryFairQueueTopologyWithItsCaddyfile(t *testing.T) {
	t.Parallel()
	var names []string
	for _, s := range configSpecs() {
		names = append(names, s.Name)
		assert.Equal(t, strings.HasSuffix(s.Name, "-cf"), s.Caddyfile, s.Name)
	}
	assert.Equal(t, []string{"haproxy", "fq-local", "fq-local-cf", "fq-redis-1", "fq-redis-1-cf", "fq-redis-3", "fq-redis-3-cf"}, names)
}
