package caddyfairqueue

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docsMetricName is a metric name anywhere in a doc: prose, the alert
// queries of docs/operations.md, the README.
var docsMetricName = regexp.MustCompile(`caddy_fair_queue_[a-z_]+`)

// TestDocumentedMetricNamesAreExported reads every metric name the
// markdown docs use (the PromQL queries and alerts an operator copies
// included, which the metrics table's own test does not read): each is
// one the module exports, or a histogram's _bucket, _sum or _count.
func TestDocumentedMetricNamesAreExported(t *testing.T) {
	exported := exportedMetrics(t)
	seen := 0
	for _, file := range append(docSnippetFiles(t), "BENCHMARKS.md") {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, name := range docsMetricName.FindAllString(string(raw), -1) {
			seen++
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suffix); ok && exported[b].histogram {
					base = b
				}
			}
			_, ok := exported[base]
			assert.True(t, ok, "%s names %s, which the module does not export", file, name)
		}
	}
	require.GreaterOrEqual(t, seen, 40, "the docs name metrics: the extraction lost them")
}
