package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFormatBytes(t *testing.T) {
	assert.Equal(t, "8 MiB", formatBytes(8<<20))
	assert.Equal(t, "512 KiB", formatBytes(512<<10))
	assert.Equal(t, "500 KiB", formatBytes(512000))
	assert.Equal(t, "512001 bytes", formatBytes(512001))
	assert.Equal(t, "2 GiB", formatBytes(2<<30))
}
