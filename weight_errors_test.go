package caddyfairqueue

import (
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A weight line may name its tenant by its raw value, an API key. A
// mistake on that line (the value given twice, the weight missing, the
// two arguments swapped) is refused at `caddy adapt`, `caddy run` and
// `caddy reload`, whose errors reach the terminal, the admin API's answer
// and the logs: the error names the option and the line, never the value.
func TestCaddyfileWeightErrorsNeverEchoTheTenantValue(t *testing.T) {
	const secret = "sk-live-4f9a2c"
	for name, tc := range map[string]struct{ lines, at string }{
		"given twice":    {"weight \"Bearer " + secret + "\" 2\n\t\tweight \"Bearer " + secret + "\" 3", "Caddyfile:6"},
		"weight missing": {"weight \"Bearer " + secret + "\"", "Caddyfile:5"},
		"swapped":        {"weight 2 \"Bearer " + secret + "\"", "Caddyfile:5"},
		"one too many":   {"weight 2 4 \"Bearer " + secret + "\"", "Caddyfile:5"},
	} {
		t.Run(name, func(t *testing.T) {
			caddyfile := `:8080 {
	fair_queue {
		permits 1
		tenant {http.request.header.Authorization}
		` + tc.lines + `
	}
}
`
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "weight", "the error names the option")
			assert.Contains(t, err.Error(), tc.at, "the error names the line")
			assert.NotContains(t, err.Error(), secret, "the tenant value, a secret, is not echoed")
		})
	}
}
