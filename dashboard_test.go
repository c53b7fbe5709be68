package caddyfairqueue

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Grafana dashboard (dashboards/fair_queue.json) must not drift from
// the metrics: every metric and label its queries use is one this
// module exports, and every metric it exports is on the dashboard.

const dashboardPath = "dashboards/fair_queue.json"

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"instance", "job"}

// exportedMetric is a metric family as the module registers it.
type exportedMetric struct {
	labels    []string // variable labels
	histogram bool
}

var (
	descName   = regexp.MustCompile(`fqName: "([^"]+)"`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
)

// exportedMetrics reads the module's metrics from its collectors, as
// registered in a config's registry: names and labels from their
// descriptions, and which are histograms from a gather after one
// observation of each vector (the gauges are read from live engines and
// none is a histogram).
func exportedMetrics(t *testing.T) map[string]exportedMetric {
	t.Helper()
	reg := prometheus.NewRegistry()
	registerMetrics(reg)
	out := make(map[string]exportedMetric)
	descs := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(descs)
		close(descs)
	}()
	for d := range descs {
		s := d.String()
		name, labels := descName.FindStringSubmatch(s), descLabels.FindStringSubmatch(s)
		require.NotNil(t, name, "name in %s", s)
		require.NotNil(t, labels, "labels in %s", s)
		var m exportedMetric
		if labels[1] != "" {
			m.labels = strings.Split(labels[1], ",")
		}
		out[name[1]] = m
	}
	require.NotEmpty(t, out)

	const label = "dashboard-test"
	observe(label, "granted", 0)
	obs := newObserver(label)
	obs.Handoff(0)
	observeFirstByte(label, "", 0)
	obs.StoreError(nil)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			m, ok := out[mf.GetName()]
			require.True(t, ok, "gathered %s was described", mf.GetName())
			m.histogram = true
			out[mf.GetName()] = m
		}
	}
	return out
}

// seriesLabels returns the labels a series of the metric named name has
// once scraped (name may be a histogram's _bucket, _sum or _count), and
// the family it belongs to, or false if the module exports no such
// series.
func seriesLabels(exported map[string]exportedMetric, name string) (family string, labels []string, ok bool) {
	if m, ok := exported[name]; ok && !m.histogram {
		return name, append(slices.Clone(m.labels), targetLabels...), true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, found := strings.CutSuffix(name, suffix)
		if m, ok := exported[base]; found && ok && m.histogram {
			labels = append(slices.Clone(m.labels), targetLabels...)
			if suffix == "_bucket" {
				labels = append(labels, "le")
			}
			return base, labels, true
		}
	}
	return "", nil, false
}

// dashboardQuery is one PromQL expression of the dashboard and the
// legend that names its series.
type dashboardQuery struct {
	where  string // panel title, or the variable
	expr   string
	legend string
}

// dashboardQueries returns every query of the dashboard: its panels'
// targets (rows included) and its query variables.
func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	raw, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	type target struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	}
	type panel struct {
		Title   string   `json:"title"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &d), dashboardPath)
	var out []dashboardQuery
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, dashboardQuery{where: "panel " + p.Title, expr: tg.Expr, legend: tg.LegendFormat})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil {
			require.NoError(t, json.Unmarshal(v.Query, &q.Query), "variable %s", v.Name)
		}
		expr := q.Query
		// label_values(<selector>, <label>): the label must be one of
		// the selector's.
		if m := regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`).FindStringSubmatch(expr); m != nil {
			expr = fmt.Sprintf("group by (%s) (%s)", m[2], m[1])
		}
		out = append(out, dashboardQuery{where: "variable " + v.Name, expr: expr})
	}
	return out
}

// promqlUse is what a PromQL expression names: the metrics it selects,
// with the labels its matchers use, and the labels it groups by.
type promqlUse struct {
	metrics  map[string][]string // metric -> matcher labels
	grouping []string            // by (...), without (...), on (...), ignoring (...)
}

// promqlKeywords are identifiers of PromQL that are not metric names
// when no "(" follows.
var promqlKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}

// promqlAggregations may be followed by their by or without clause
// before their "(".
var promqlAggregations = []string{"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}

var (
	promqlIdent    = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promqlVariable = regexp.MustCompile(`^\$(\{[^}]*\}|\w+)`)
	promqlNumber   = regexp.MustCompile(`^[0-9][0-9a-zA-Z.]*`) // numbers and durations
	// promqlMatcher is one label matcher and what follows it.
	promqlMatcher = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*(,|\})`)
)

// parsePromQL reads the metric names and labels an expression uses. It
// knows enough PromQL for dashboards: selectors with matchers, ranges
// and subqueries, function calls, aggregations with by/without, and
// vector matching with on/ignoring; Grafana's $variables may stand in
// strings and ranges.
func parsePromQL(expr string) (promqlUse, error) {
	use := promqlUse{metrics: make(map[string][]string)}
	s := expr
	skipSpace := func() { s = strings.TrimLeft(s, " \t\n") }
	// labelList reads "(a, b)" after by/without/on/ignoring/group_*.
	labelList := func() ([]string, error) {
		skipSpace()
		if !strings.HasPrefix(s, "(") {
			return nil, nil // group_left without labels
		}
		end := strings.IndexByte(s, ')')
		if end < 0 {
			return nil, fmt.Errorf("unclosed label list in %q", expr)
		}
		var labels []string
		for _, l := range strings.Split(s[1:end], ",") {
			if l = strings.TrimSpace(l); l != "" {
				if !promqlIdent.MatchString(l) || promqlIdent.FindString(l) != l {
					return nil, fmt.Errorf("bad label %q in %q", l, expr)
				}
				labels = append(labels, l)
			}
		}
		s = s[end+1:]
		return labels, nil
	}
	// matchers reads `{a="x", b=~"y"}` and returns the label names.
	matchers := func() ([]string, error) {
		s = s[1:]
		var labels []string
		for {
			m := promqlMatcher.FindStringSubmatch(s)
			if m == nil {
				return nil, fmt.Errorf("cannot read the matchers %q in %q", s, expr)
			}
			labels = append(labels, m[1])
			s = s[len(m[0]):]
			if m[2] == "}" {
				return labels, nil
			}
		}
	}
	for {
		skipSpace()
		if s == "" {
			return use, nil
		}
		switch {
		case s[0] == '"' || s[0] == '\'' || s[0] == '`':
			end := strings.IndexByte(s[1:], s[0])
			if end < 0 {
				return use, fmt.Errorf("unclosed string in %q", expr)
			}
			s = s[end+2:]
		case s[0] == '[': // range or subquery: durations and $variables
			end := strings.IndexByte(s, ']')
			if end < 0 {
				return use, fmt.Errorf("unclosed range in %q", expr)
			}
			s = s[end+1:]
		case s[0] == '{':
			return use, fmt.Errorf("a selector without a metric name in %q", expr)
		case promqlVariable.MatchString(s):
			s = s[len(promqlVariable.FindString(s)):]
		case promqlNumber.MatchString(s):
			s = s[len(promqlNumber.FindString(s)):]
		case promqlIdent.MatchString(s):
			id := promqlIdent.FindString(s)
			s = s[len(id):]
			skipSpace()
			switch {
			case slices.Contains([]string{"by", "without", "on", "ignoring", "group_left", "group_right"}, id):
				labels, err := labelList()
				if err != nil {
					return use, err
				}
				use.grouping = append(use.grouping, labels...)
			case strings.HasPrefix(s, "("), slices.Contains(promqlAggregations, id): // a function or an aggregation
			case slices.Contains(promqlKeywords, strings.ToLower(id)):
			default:
				labels := use.metrics[id]
				if strings.HasPrefix(s, "{") {
					more, err := matchers()
					if err != nil {
						return use, err
					}
					labels = append(labels, more...)
				}
				use.metrics[id] = labels
			}
		case strings.ContainsRune("()+-*/%^,<>=!", rune(s[0])):
			s = s[1:]
		default:
			return use, fmt.Errorf("cannot read %q in %q", s, expr)
		}
	}
}

func TestParsePromQLFindsMetricsAndLabels(t *testing.T) {
	for _, tc := range []struct {
		expr     string
		metrics  map[string][]string
		grouping []string
	}{
		{`up`, map[string][]string{"up": nil}, nil},
		{`sum by (queue, reason) (rate(x_total{queue=~"${queue}", reason!="a,}"}[$__rate_interval])) > 0`,
			map[string][]string{"x_total": {"queue", "reason"}}, []string{"queue", "reason"}},
		{`histogram_quantile(0.99, sum(rate(h_bucket{a="1"}[5m])) without (instance))`,
			map[string][]string{"h_bucket": {"a"}}, []string{"instance"}},
		{`a / on (queue) group_left max by (queue) (b{c='x'}) offset 5m`,
			map[string][]string{"a": nil, "b": {"c"}}, []string{"queue", "queue"}},
		{`max_over_time(g[1h:5m]) and bool 1e3`, map[string][]string{"g": nil}, nil},
		{`min by (instance) (s) + count without (le) (h_count)`, map[string][]string{"s": nil, "h_count": nil}, []string{"instance", "le"}},
	} {
		use, err := parsePromQL(tc.expr)
		require.NoError(t, err, tc.expr)
		assert.Equal(t, tc.metrics, use.metrics, tc.expr)
		assert.Equal(t, tc.grouping, use.grouping, tc.expr)
	}
	for _, bad := range []string{`{__name__="x"}`, `x{a="1"`, `x{a=1}`, `sum by (a (x)`} {
		_, err := parsePromQL(bad)
		assert.Error(t, err, bad)
	}
}

var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

func TestDashboardQueriesUseOnlyExportedMetricsAndLabels(t *testing.T) {
	exported := exportedMetrics(t)
	queries := dashboardQueries(t)
	require.NotEmpty(t, queries)
	for _, q := range queries {
		use, err := parsePromQL(q.expr)
		if !assert.NoError(t, err, q.where) {
			continue
		}
		assert.NotEmpty(t, use.metrics, "%s: %s names no metric", q.where, q.expr)
		known := make(map[string]bool) // the labels of the query's series
		for name, matched := range use.metrics {
			_, labels, ok := seriesLabels(exported, name)
			if !assert.True(t, ok, "%s: %s is not a metric of the module (%s)", q.where, name, q.expr) {
				continue
			}
			for _, l := range labels {
				known[l] = true
			}
			for _, l := range matched {
				assert.Contains(t, labels, l, "%s: %s has no label %s", q.where, name, l)
			}
		}
		for _, l := range use.grouping {
			assert.True(t, known[l], "%s: no series of %s has the label %s it groups by", q.where, q.expr, l)
		}
		// A legend names labels the result keeps: those grouped by,
		// when the query aggregates.
		keep := known
		if len(use.grouping) > 0 {
			keep = make(map[string]bool)
			for _, l := range use.grouping {
				keep[l] = true
			}
		}
		for _, m := range legendLabel.FindAllStringSubmatch(q.legend, -1) {
			assert.True(t, keep[m[1]], "%s: legend %q names %s, which %s does not keep", q.where, q.legend, m[1], q.expr)
		}
	}
}

func TestDashboardShowsEveryExportedMetric(t *testing.T) {
	exported := exportedMetrics(t)
	shown := make(map[string]bool)
	for _, q := range dashboardQueries(t) {
		use, err := parsePromQL(q.expr)
		require.NoError(t, err, q.where)
		for name := range use.metrics {
			if family, _, ok := seriesLabels(exported, name); ok {
				shown[family] = true
			}
		}
	}
	var missing []string
	for name := range exported {
		if !shown[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	assert.Empty(t, missing, "metrics with no panel in %s: add one", dashboardPath)
}
