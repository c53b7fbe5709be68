package caddyfairqueue

import (
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A value out of its option's own bounds is refused with the option's
// own line, as docs/reference.md says, not with the line that closes the
// block: in a long block that line points the operator elsewhere. Here
// the bad option is on line 3 and the block closes on line 5.
func TestCaddyfileBoundsErrorsNameTheOptionsLine(t *testing.T) {
	for name, tc := range map[string]struct{ bad, rest, option string }{
		"permits above the most": {"permits 1048577", "name q", "permits"},
		"abort_grace above 1m":   {"abort_grace 61s", "permits 1", "abort_grace"},
		"upstream_cooldown 6m":   {"upstream_cooldown 6m", "upstream 10.0.0.5:8000 1", "upstream_cooldown"},
		"max_requeues 101":       {"max_requeues 101", "upstream 10.0.0.5:8000 1", "max_requeues"},
		"upstream a URL":         {"upstream http://10.0.0.5:8000 1", "name q", "upstream"},
		"upstream without port":  {"upstream 10.0.0.5 1", "name q", "upstream"},
		"upstream a port range":  {"upstream 10.0.0.5:8000-8002 1", "name q", "upstream"},
	} {
		t.Run(name, func(t *testing.T) {
			caddyfile := ":8080 {\n\tfair_queue {\n\t\t" + tc.bad + "\n\t\t" + tc.rest + "\n\t}\n\treverse_proxy 127.0.0.1:8000\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.option, "the error names the option")
			assert.Contains(t, err.Error(), "Caddyfile:3", "the error names the option's own line")
		})
	}
}

// The same holds for an option of a block inside fair_queue's: a Redis
// URL that is not one, or a backend_metrics that is neither a path nor
// an http(s) URL, is refused at its own line (5), not at the line that
// closes its block (7) or fair_queue's (9).
func TestCaddyfileBlockOptionErrorsNameTheOptionsLine(t *testing.T) {
	for name, tc := range map[string]struct{ block, option string }{
		"redis url":       {"redis {\n\t\t\turl bogus://10.0.0.5:6379\n\t\t\tkey_prefix a\n\t\t}", "url"},
		"backend_metrics": {"adaptive {\n\t\t\tbackend_metrics ftp://10.0.0.5/metrics\n\t\t\ttarget_ttft 1s\n\t\t}", "backend_metrics"},
	} {
		t.Run(name, func(t *testing.T) {
			caddyfile := ":8080 {\n\tfair_queue {\n\t\tpermits 1\n\t\t" + tc.block + "\n\t\tname q\n\t}\n\treverse_proxy 127.0.0.1:8000\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.option, "the error names the option")
			assert.Contains(t, err.Error(), "Caddyfile:5", "the error names the option's own line")
		})
	}
}
