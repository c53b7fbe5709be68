package caddyfairqueue

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// placementWarnings validates a Caddyfile as `caddy validate` does, its
// logs written to a file, and returns the placement warnings logged.
func placementWarnings(t *testing.T, caddyfile string) []map[string]any {
	t.Helper()
	return provisionWarnings(t, caddyfile, "has no reverse_proxy after it")
}

// provisionWarnings validates a Caddyfile as `caddy validate` does, its
// logs written to a file, and returns the entries logged whose message
// holds msg.
func provisionWarnings(t *testing.T, caddyfile, msg string) []map[string]any {
	t.Helper()
	var cfg map[string]any
	require.NoError(t, json.Unmarshal([]byte(adapt(t, strings.TrimRight(caddyfile, "\n")+"\n")), &cfg))
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	cfg["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{
		"writer":  map[string]any{"output": "file", "filename": logFile},
		"encoder": map[string]any{"format": "json"},
	}}}
	raw, err := json.Marshal(cfg)
	require.NoError(t, err)
	var c caddy.Config
	require.NoError(t, json.Unmarshal(raw, &c))
	require.NoError(t, caddy.Validate(&c), "Caddy takes the config: only the module can tell")

	f, err := os.Open(logFile)
	require.NoError(t, err)
	defer f.Close()
	var warnings []map[string]any
	for sc := bufio.NewScanner(f); sc.Scan(); {
		var entry map[string]any
		if json.Unmarshal(sc.Bytes(), &entry) == nil && strings.Contains(entry["msg"].(string), msg) {
			warnings = append(warnings, entry)
		}
	}
	return warnings
}

func TestFairQueueThatNoReverseProxyFollowsIsReportedAtProvision(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	// The config: handle runs before the site's fair_queue, so the
	// proxied requests never meet it.
	warnings := placementWarnings(t, `:0 {
	handle /v1/* {
		reverse_proxy 127.0.0.1:9
	}
	fair_queue {
		name llm
		permits 1
	}
}`)
	require.Len(t, warnings, 1)
	w := warnings[0]
	assert.Equal(t, "warn", w["level"])
	assert.Equal(t, "llm", w["queue"])
	assert.Equal(t, true, w["reverse_proxy_before_it"])
	assert.Contains(t, w["msg"], "put fair_queue inside the block of the reverse_proxy")
}

func TestFairQueueBeforeItsReverseProxyIsNotReported(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for name, site := range map[string]string{
		"same block": `handle /v1/* {
		fair_queue {
			permits 1
		}
		reverse_proxy 127.0.0.1:9
	}`,
		"site level, both": `fair_queue {
		permits 1
	}
	reverse_proxy 127.0.0.1:9`,
		"route, then the rest proxied": `route /v1/* {
		fair_queue {
			permits 1
		}
		reverse_proxy 127.0.0.1:9
	}
	handle /health {
		respond ok
	}
	reverse_proxy 127.0.0.1:9`,
	} {
		t.Run(name, func(t *testing.T) {
			assert.Empty(t, placementWarnings(t, ":0 {\n\t"+site+"\n}"))
		})
	}
	raw, err := os.ReadFile("Caddyfile.example")
	require.NoError(t, err)
	assert.Empty(t, placementWarnings(t, string(raw)), "the example")
}

// Named routes may invoke named routes, each one more than once (a
// route of shared steps run for several paths): Caddy provisions each
// named route once, and loads such a config at once. The check, which
// reads a named route where an invoke runs it, must end too: it read
// every run of every one, 2^32 runs of the innermost here, and `caddy
// run`, `validate` and each reload hung at the first fair_queue.
func TestPlacementCheckOfNamedRoutesInvokedOverAndOverEnds(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const levels = 32
	var b strings.Builder
	b.WriteString("&(r0) {\n\treverse_proxy 127.0.0.1:9\n}\n")
	for i := 1; i <= levels; i++ {
		fmt.Fprintf(&b, "&(r%d) {\n\troute {\n\t\tinvoke r%d\n\t\tinvoke r%d\n\t}\n}\n", i, i-1, i-1)
	}
	fmt.Fprintf(&b, ":0 {\n\troute {\n\t\tfair_queue {\n\t\t\tpermits 1\n\t\t}\n\t\tinvoke r%d\n\t}\n}\n", levels)
	done := make(chan []map[string]any, 1)
	go func() { done <- placementWarnings(t, b.String()) }()
	select {
	case w := <-done:
		assert.Empty(t, w, "a reverse_proxy runs after the fair_queue")
	case <-time.After(2 * time.Minute): // milliseconds once it ends: no timing asserted
		t.Fatal("the placement check of a config Caddy loads at once never ended")
	}
}
