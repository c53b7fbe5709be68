package caddyfairqueue

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docsTestName is a test the docs cite as evidence (`TestX`).
var docsTestName = regexp.MustCompile("`(Test[A-Za-z0-9_]+)`")

// docsFilePath is a source file the docs cite (`integration/pool_test.go`).
var docsFilePath = regexp.MustCompile("`([a-z0-9_-]+(?:/[a-z0-9_.-]+)+\\.(?:go|lua|sh|html|json))`")

// TestDocumentedTestsAndFilesExist reads the tests and source files the
// markdown docs cite for what they claim: each test is a function of
// some _test.go file of the repository, and each path a file of it
// (from the root, or from the package the text is about), so
// that a reader who goes to look finds what was cited.
func TestDocumentedTestsAndFilesExist(t *testing.T) {
	tests := map[string]bool{}
	var files []string
	testFunc := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	require.NoError(t, filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		files = append(files, filepath.ToSlash(path))
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(raw), -1) {
			tests[m[1]] = true
		}
		return nil
	}))

	cited := 0
	for _, file := range docSnippetFiles(t) {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range docsTestName.FindAllStringSubmatch(string(raw), -1) {
			cited++
			assert.True(t, tests[m[1]], "%s cites %s, which no test file defines", file, m[1])
		}
		for _, m := range docsFilePath.FindAllStringSubmatch(string(raw), -1) {
			cited++
			// From the root, or from the package the text is about
			// (`lua/acquire.lua` of fairqueue/redisstore).
			found := slices.ContainsFunc(files, func(f string) bool { return f == m[1] || strings.HasSuffix(f, "/"+m[1]) })
			assert.True(t, found, "%s cites %s, which is no file of the repository", file, m[1])
		}
	}
	require.GreaterOrEqual(t, cited, 50, "the docs cite tests and files: the extraction lost them")
}
