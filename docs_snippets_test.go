package caddyfairqueue

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/stretchr/testify/require"
)

// docSnippet is one fenced caddyfile or json block of a markdown file.
type docSnippet struct {
	file string // the markdown file
	line int    // the line of its opening fence
	lang string // "caddyfile" or "json"
	text string
}

// docSnippetFiles are the markdown files an operator reads.
func docSnippetFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md"}
	docs, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	return append(files, docs...)
}

// readDocSnippets returns the caddyfile and json blocks of a markdown file.
func readDocSnippets(t *testing.T, file string) []docSnippet {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var (
		out  []docSnippet
		cur  *docSnippet
		body strings.Builder
		n    int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		fence := strings.TrimSpace(line)
		if !strings.HasPrefix(fence, "```") {
			if cur != nil {
				body.WriteString(line + "\n")
			}
			continue
		}
		if cur != nil {
			cur.text = body.String()
			out = append(out, *cur)
			cur = nil
			continue
		}
		if lang := strings.ToLower(strings.TrimPrefix(fence, "```")); lang == "caddyfile" || lang == "json" {
			cur = &docSnippet{file: file, line: n, lang: lang}
			body.Reset()
		} else {
			cur = &docSnippet{file: file, line: n, lang: ""}
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a fence left open", file)
	kept := out[:0]
	for _, s := range out {
		if s.lang != "" {
			kept = append(kept, s)
		}
	}
	return kept
}

// syntaxMarker tells a syntax summary (`permits <n>`) from a config.
var syntaxMarker = regexp.MustCompile(`<[a-z][a-z :_]*>`)

// definesInference finds a snippet's own @inference matcher.
var definesInference = regexp.MustCompile(`(?m)^\s*@inference\s*\{`)

// wrapCaddyfileSnippet makes a whole Caddyfile of a fragment: a fragment
// that does not open with a site address or the global options goes into
// a site that defines the @inference matcher it may name, and proxies.
func wrapCaddyfileSnippet(text string) string {
	first := ""
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			first = l
			break
		}
	}
	if strings.HasPrefix(first, ":") || first == "{" {
		return text
	}
	matcher := ""
	if !definesInference.MatchString(text) {
		matcher = "\t@inference {\n\t\tmethod POST\n\t}\n"
	}
	var b strings.Builder
	b.WriteString(":8080 {\n" + matcher)
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if l != "" {
			l = "\t" + l
		}
		b.WriteString(l + "\n")
	}
	b.WriteString("\treverse_proxy 127.0.0.1:8000\n}\n")
	return b.String()
}

// wrapJSONSnippet makes a whole config of a handler's JSON (a whole
// config is taken as it is); ok is false for JSON that is neither (an
// admin API answer, a fragment).
func wrapJSONSnippet(text string) (cfg string, ok bool) {
	var v map[string]any
	switch {
	case json.Unmarshal([]byte(text), &v) != nil:
		return "", false
	case v["apps"] != nil:
		return text, true
	case v["handler"] == "fair_queue":
		return `{"apps":{"http":{"servers":{"s":{"listen":[":0"],"routes":[{"handle":[` +
			text + `,{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:8000"}]}]}]}}}}}`, true
	}
	return "", false
}

// TestDocumentedConfigsAdaptAndValidate loads every Caddyfile and JSON
// config in the markdown docs as `caddy adapt` and `caddy validate` do
// (no Redis need run): a snippet an operator copies must load.
func TestDocumentedConfigsAdaptAndValidate(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	loaded := 0
	for _, file := range docSnippetFiles(t) {
		for _, s := range readDocSnippets(t, file) {
			t.Run(fmt.Sprintf("%s:%d", s.file, s.line), func(t *testing.T) {
				var cfg caddy.Config
				switch s.lang {
				case "caddyfile":
					if syntaxMarker.MatchString(s.text) {
						t.Skip("a syntax summary, not a config")
					}
					out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(wrapCaddyfileSnippet(s.text)), nil)
					require.NoError(t, err)
					for _, w := range warnings {
						// The docs align their comments for the reader; caddy fmt would not.
						if !strings.Contains(w.Message, "not formatted") {
							t.Errorf("adapt warning: %s:%d: %s", w.File, w.Line, w.Message)
						}
					}
					require.NoError(t, json.Unmarshal(out, &cfg))
				case "json":
					raw, ok := wrapJSONSnippet(s.text)
					if !ok {
						t.Skip("not a config: an answer or a fragment")
					}
					require.NoError(t, json.Unmarshal([]byte(raw), &cfg))
				}
				require.NoError(t, caddy.Validate(&cfg))
				loaded++
			})
		}
	}
	require.GreaterOrEqual(t, loaded, 15, "the docs hold at least this many configs: the extraction lost some")
}
