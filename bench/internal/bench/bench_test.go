package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRenderRewritesTheReportFromResultsJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	res := &report.Results{Mode: "full", Settings: report.DefaultSettings(false), Machine: report.Machine{CPUs: 2}}
	res.Systems = []*report.System{
		{Spec: systems.DefaultSpecs()[0], Saturated: &report.LoadRun{Throughput: 100, UpstreamMax: 4}},
		{Spec: systems.DefaultSpecs()[0], SaturatedStream: &report.LoadRun{Throughput: 90, UpstreamMax: 5}},
	}
	data, err := json.Marshal(res)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "results.json"), data, 0o644))

	md := filepath.Join(dir, "BENCHMARKS.md")
	got, err := Render(Options{OutDir: dir, Markdown: md})
	require.NoError(t, err)
	assert.Equal(t, "full", got.Mode)
	report, err := os.ReadFile(md)
	require.NoError(t, err)
	assert.Contains(t, string(report), "| upstream max concurrency <= permits | haproxy (streamed) | 5 vs 4 | FAIL |",
		"the targets are evaluated again")
}
