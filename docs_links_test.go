package caddyfairqueue

import (
	"bufio"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docsLink is a markdown link or image to a file of the repository:
// [text](path) or ![alt](path), a path with no scheme.
var docsLink = regexp.MustCompile(`\]\(([^)\s#:]+)(?:#[^)\s]*)?\)`)

// TestDocsLinksReachCommittedFiles: each link of the markdown docs to a
// file of the repository (a chart, a page, an example) reaches a file
// that is there and that git keeps. BENCHMARKS.md showed its charts
// from bench-results/, which .gitignore leaves out: broken on GitHub and
// in every clone, though they showed where the bench had run.
func TestDocsLinksReachCommittedFiles(t *testing.T) {
	ignored := readGitignore(t)
	checked := 0
	for _, file := range append(docSnippetFiles(t), "BENCHMARKS.md", "CHANGELOG.md") {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range docsLink.FindAllStringSubmatch(string(raw), -1) {
			target := path.Clean(path.Join(path.Dir(file), m[1]))
			checked++
			_, err := os.Stat(filepath.FromSlash(target))
			assert.NoError(t, err, "%s links %s, which is no file of the repository", file, m[1])
			if pattern, ok := ignored(target); ok {
				assert.Fail(t, "a link to an ignored file", "%s links %s, which .gitignore leaves out (%s): not in a clone, nor on GitHub", file, m[1], pattern)
			}
		}
	}
	require.GreaterOrEqual(t, checked, 20, "the docs link files: the extraction lost them")
}

// readGitignore reads the repository's .gitignore into a matcher of a
// path from the root: the pattern that ignores it, if one does. It knows
// the forms the file uses (an anchored /path, a dir/, a glob of a name
// at any depth) and fails on one it does not (a negation).
func readGitignore(t *testing.T) func(string) (string, bool) {
	t.Helper()
	f, err := os.Open(".gitignore")
	require.NoError(t, err)
	defer f.Close()
	var patterns []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		require.False(t, strings.HasPrefix(line, "!"), ".gitignore: a negation (%s) this test does not read", line)
		patterns = append(patterns, line)
	}
	require.NoError(t, sc.Err())
	return func(p string) (string, bool) {
		segs := strings.Split(p, "/")
		for _, pattern := range patterns {
			pat := strings.TrimSuffix(pattern, "/")
			if anchored, ok := strings.CutPrefix(pat, "/"); ok || strings.Contains(pat, "/") {
				if !ok {
					anchored = pat
				}
				// The path or a directory above it, from the root.
				n := len(strings.Split(anchored, "/"))
				if n <= len(segs) {
					if match, _ := path.Match(anchored, strings.Join(segs[:n], "/")); match {
						return pattern, true
					}
				}
				continue
			}
			// A name at any depth: the file's or a directory's above it.
			for _, s := range segs {
				if match, _ := path.Match(pat, s); match {
					return pattern, true
				}
			}
		}
		return "", false
	}
}
