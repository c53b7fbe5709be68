package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the expected JSON of the adapt tests")

// adaptSeparator divides a .caddytest file: the Caddyfile above, the JSON
// it must adapt to below.
const adaptSeparator = "\n----------\n"

// TestCaddyfileAdaptsToExpectedJSON runs every testdata/*.caddytest.
func TestCaddyfileAdaptsToExpectedJSON(t *testing.T) {
	files, err := filepath.Glob("testdata/*.caddytest")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no testdata/*.caddytest files")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			caddyfile, want, ok := strings.Cut(string(raw), adaptSeparator)
			if !ok {
				t.Fatalf("%s: no %q line", f, strings.TrimSpace(adaptSeparator))
			}
			got := adapt(t, caddyfile+"\n")
			if *update {
				if err := os.WriteFile(f, []byte(caddyfile+adaptSeparator+got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if strings.TrimSpace(want) != got {
				t.Errorf("%s adapts to:\n%s\nwant:\n%s", f, got, strings.TrimSpace(want))
			}
		})
	}
}

// TestCaddyfileExampleAdapts keeps Caddyfile.example working: it must
// adapt, and to the JSON in testdata/Caddyfile.example.json.
func TestCaddyfileExampleAdapts(t *testing.T) {
	raw, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	got := adapt(t, string(raw))
	golden := filepath.Join("testdata", "Caddyfile.example.json")
	if *update {
		if err := os.WriteFile(golden, []byte(got+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(want)) != got {
		t.Errorf("Caddyfile.example adapts to:\n%s\nwant (%s):\n%s", got, golden, want)
	}
}

// adapt turns a Caddyfile into indented JSON, failing on warnings too.
func adapt(t *testing.T, caddyfile string) string {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	out, warnings, err := adapter.Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("adapt warning: %s:%d: %s", w.File, w.Line, w.Message)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// validate loads a Caddyfile as `caddy validate` does: every module is
// provisioned (with the real config-load context) and cleaned up.
func validate(t *testing.T, caddyfile string) error {
	t.Helper()
	var cfg caddy.Config
	require.NoError(t, json.Unmarshal([]byte(adapt(t, caddyfile)), &cfg))
	return caddy.Validate(&cfg)
}

func TestCaddytestConfigsValidate(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	files, err := filepath.Glob("testdata/*.caddytest")
	require.NoError(t, err)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			caddyfile, _, _ := strings.Cut(string(raw), adaptSeparator)
			// Provisioning makes no Redis call: none need run.
			require.NoError(t, validate(t, caddyfile+"\n"))
		})
	}
}

func TestCaddyfileExampleValidatesWithoutRedis(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	raw, err := os.ReadFile("Caddyfile.example")
	require.NoError(t, err)
	// Redis need not run: provisioning makes no Redis call.
	require.NoError(t, validate(t, string(raw)))
}

func TestConfigWhoseHandlersDisagreeOnAQueueIsRefused(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	err := validate(t, `:8080 {
	handle /a {
		fair_queue {
			name shared
			permits 4
			redis redis://127.0.0.1:6379
		}
		respond ok
	}
	handle /b {
		fair_queue {
			name shared
			permits 8
			redis redis://127.0.0.1:6379
		}
		respond ok
	}
}

:8081 {
	fair_queue {
		name shared
		permits 4
		redis redis://127.0.0.1:6379
	}
	respond ok
}
`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `queue "shared" is configured by two fair_queue handlers with different permits (4 and 8)`)

	// The same queue in another Redis database is another queue.
	require.NoError(t, validate(t, `:8080 {
	handle /a {
		fair_queue {
			name shared
			permits 4
			redis redis://127.0.0.1:6379/0
		}
		respond ok
	}
	handle /b {
		fair_queue {
			name shared
			permits 8
			redis redis://127.0.0.1:6379/1
		}
		respond ok
	}
}
`))
}
