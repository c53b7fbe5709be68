package caddyfairqueue

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/assert"
)

// TestDocumentedConfigsArePlacedAsTheyClaim loads every Caddyfile of the
// markdown docs as `caddy validate` does and reads the placement
// warnings it logs: a config the docs mark WRONG (README, "Where
// fair_queue goes") is reported, as the README says, and no other
// config an operator copies is, whether its fair_queue protects a
// reverse_proxy or a pool's.
func TestDocumentedConfigsArePlacedAsTheyClaim(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	wrong := 0
	for _, file := range docSnippetFiles(t) {
		for _, s := range readDocSnippets(t, file) {
			if s.lang != "caddyfile" || syntaxMarker.MatchString(s.text) {
				continue
			}
			t.Run(fmt.Sprintf("%s:%d", s.file, s.line), func(t *testing.T) {
				// Formatted as caddy fmt would: the docs align their comments.
				cfg := string(caddyfile.Format([]byte(wrapCaddyfileSnippet(s.text))))
				warnings := append(placementWarnings(t, cfg),
					provisionWarnings(t, cfg, "does not take the granted upstream")...)
				if strings.Contains(s.text, "WRONG") {
					wrong++
					assert.NotEmpty(t, warnings, "the docs call it wrong: it is reported at load")
					return
				}
				for _, w := range warnings {
					t.Errorf("a documented config is reported at load: %s", w["msg"])
				}
			})
		}
	}
	assert.Equal(t, 1, wrong, "the README's wrong placement is among the snippets")
}
