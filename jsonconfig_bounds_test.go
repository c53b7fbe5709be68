package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A JSON duration given as a bare number is nanoseconds, as every Caddy
// duration: an operator who writes "abort_grace": 50 meaning 50ms gets
// 50ns. The Caddyfile refuses those values (no unit, or below the
// option's least: 1ms for abort_grace, upstream_cooldown and
// adaptive.target_ttft); JSON loaded them and ran them: an abort grace
// of nothing, no cooldown, a TTFT target every answer breaches (the
// capacity pinned at its floor). JSON must refuse what the Caddyfile
// refuses, naming the field.
func TestJSONConfigRefusesTheSubMillisecondDurationsTheCaddyfileRefuses(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const pool = `"upstreams":[{"dial":"127.0.0.1:8000","permits":2}],`
	for _, tc := range []struct {
		name, fields, want string
	}{
		{"abort_grace as a number", `"permits":1,"abort_grace":50`, "abort_grace: want a duration of at least 1ms or off, got 50ns"},
		{"abort_grace in microseconds", `"permits":1,"abort_grace":"500us"`, "abort_grace: want a duration of at least 1ms or off, got 500µs"},
		{"upstream_cooldown as a number", pool + `"upstream_cooldown":1000`, "upstream_cooldown must be at least 1ms, got 1µs"},
		{"target_ttft as a number", `"permits":1,"adaptive":{"target_ttft":500}`, "adaptive.target_ttft: must be at least 1ms, got 500ns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := loadHandlerJSON(t, tc.fields)
			require.Error(t, err, "the config loads")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// What the Caddyfile takes, JSON takes.
	for _, fields := range []string{
		`"permits":1,"abort_grace":"1ms"`,
		`"permits":1,"abort_grace":"-1ns"`,
		pool + `"upstream_cooldown":"1ms"`,
		`"permits":1,"adaptive":{"target_ttft":"1ms"}`,
	} {
		assert.NoError(t, loadHandlerJSON(t, fields), fields)
	}
}
