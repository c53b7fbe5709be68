package caddyfairqueue

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// makeCommand is a `make <target>` the docs tell an operator to run, in
// a code span or at the start of a line of a shell block.
var makeCommand = regexp.MustCompile("(?m)(?:`|^)make ([a-z][a-z0-9-]*)")

// TestDocumentedMakeTargetsExist reads every `make <target>` of the
// markdown docs: each is a target of the Makefile, so that a command
// copied from the docs runs.
func TestDocumentedMakeTargetsExist(t *testing.T) {
	raw, err := os.ReadFile("Makefile")
	require.NoError(t, err)
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(raw), -1) {
		targets[m[1]] = true
	}
	files := append(docSnippetFiles(t), "BENCHMARKS.md")
	seen := 0
	for _, file := range files {
		text, err := os.ReadFile(filepath.Clean(file))
		require.NoError(t, err)
		for _, m := range makeCommand.FindAllStringSubmatch(string(text), -1) {
			seen++
			assert.True(t, targets[m[1]], "%s: `make %s` is not a target of the Makefile", file, m[1])
		}
	}
	require.GreaterOrEqual(t, seen, 20, "the docs name make targets: the extraction lost them")
}

// TestReadmeXcaddyCommandMatchesTheBuild checks the xcaddy command the
// README spells out against what `make xcaddy` runs: the Caddy version
// of go.mod and the Makefile's xcaddy version, so that the command
// copied from the README builds the same Caddy.
func TestReadmeXcaddyCommandMatchesTheBuild(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	gomod, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	makefile, err := os.ReadFile("Makefile")
	require.NoError(t, err)

	caddyVersion := regexp.MustCompile(`(?m)^\s*github\.com/caddyserver/caddy/v2 (v\S+)`).FindSubmatch(gomod)
	require.NotNil(t, caddyVersion, "go.mod requires Caddy")
	readmeCaddy := regexp.MustCompile(`CADDY_VERSION=(v\S+)`).FindSubmatch(readme)
	require.NotNil(t, readmeCaddy, "the README's xcaddy command sets CADDY_VERSION")
	assert.Equal(t, string(caddyVersion[1]), string(readmeCaddy[1]), "the README's CADDY_VERSION is go.mod's")

	xcaddy := regexp.MustCompile(`(?m)^XCADDY \?= (\S+)`).FindSubmatch(makefile)
	require.NotNil(t, xcaddy, "the Makefile names its xcaddy")
	assert.Contains(t, string(readme), "go run "+string(xcaddy[1])+" build", "the README runs the Makefile's xcaddy")
}
