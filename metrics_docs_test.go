package caddyfairqueue

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docsMetricRow is a row of the metrics table of docs/operations.md:
// | `name` | type | labels | meaning |.
var docsMetricRow = regexp.MustCompile("(?m)^\\| `(caddy_fair_queue_[a-z_]+)` \\| ([a-z]+) \\| ([a-z, ]+) \\|")

// The metrics table of docs/operations.md lists every metric the module
// exports, with its type and labels, and nothing else.
func TestOperationsDocListsEveryExportedMetric(t *testing.T) {
	raw, err := os.ReadFile("docs/operations.md")
	require.NoError(t, err)
	exported := exportedMetrics(t)
	documented := make(map[string]bool)
	for _, m := range docsMetricRow.FindAllStringSubmatch(string(raw), -1) {
		name, typ, labels := m[1], m[2], strings.Split(strings.ReplaceAll(m[3], " ", ""), ",")
		documented[name] = true
		e, ok := exported[name]
		if !assert.True(t, ok, "documented %s is not exported", name) {
			continue
		}
		want := "gauge"
		switch {
		case e.histogram:
			want = "histogram"
		case strings.HasSuffix(name, "_total"):
			want = "counter"
		}
		assert.Equal(t, want, typ, "type of %s", name)
		got := slices.Clone(e.labels)
		slices.Sort(got)
		slices.Sort(labels)
		assert.Equal(t, got, labels, "labels of %s", name)
	}
	for name := range exported {
		assert.True(t, documented[name], "exported %s is not in the table of docs/operations.md", name)
	}
}
