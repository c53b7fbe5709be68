package caddyfairqueue

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// referenceSyntax is the syntax block of docs/reference.md.
func referenceSyntax(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("docs/reference.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(raw), "```caddyfile\n")
	require.True(t, ok, "docs/reference.md has no caddyfile block")
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	return block
}

// godocSyntax is the syntax in UnmarshalCaddyfile's doc comment, as
// `go doc` shows it.
func godocSyntax(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("caddyfile.go")
	require.NoError(t, err)
	var b strings.Builder
	in := false
	for _, l := range strings.Split(string(raw), "\n") {
		l, isDoc := strings.CutPrefix(l, "//\t")
		if strings.HasPrefix(l, "fair_queue [<matcher>] {") {
			in = true
		}
		if in && isDoc {
			b.WriteString(l + "\n")
			if l == "}" {
				break
			}
		} else if in && strings.TrimSpace(l) == "//" {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// syntaxOptions are the option names of a syntax block, every level.
func syntaxOptions(block string) []string {
	var out []string
	for _, l := range strings.Split(block, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") || f[0] == "}" || f[0] == "fair_queue" {
			continue
		}
		out = append(out, f[0])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// parserOptions are the keys of every option table the Caddyfile
// parsers hand to parseBlock.
func parserOptions(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var out []string
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			m, ok := lit.Type.(*ast.MapType)
			if !ok {
				return true
			}
			if id, ok := m.Value.(*ast.Ident); !ok || id.Name != "optionParser" {
				return true
			}
			for _, e := range lit.Elts {
				key, err := strconv.Unquote(e.(*ast.KeyValueExpr).Key.(*ast.BasicLit).Value)
				require.NoError(t, err)
				out = append(out, key)
			}
			return true
		})
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestReferenceSyntaxIsTheParsersOwn keeps the syntax of
// docs/reference.md, the one in UnmarshalCaddyfile's doc comment and the
// options the parser takes the same.
func TestReferenceSyntaxIsTheParsersOwn(t *testing.T) {
	ref := referenceSyntax(t)
	doc := strings.Split(godocSyntax(t), "\n")
	for i, l := range strings.Split(ref, "\n") {
		if i >= len(doc) || doc[i] != l {
			t.Errorf("line %d of the syntax: docs/reference.md has\n\t%s\nUnmarshalCaddyfile's doc comment\n\t%s", i+1, l, doc[min(i, len(doc)-1)])
		}
	}
	assert.Len(t, doc, len(strings.Split(ref, "\n")), "the syntax blocks differ in length")
	assert.Equal(t, parserOptions(t), syntaxOptions(ref), "the options the parser takes and those docs/reference.md lists differ")
}
