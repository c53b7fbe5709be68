package caddyfairqueue

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Caddyfile.example offers a queue per model, commented out: `name
// {http.fair_queue.model}` with `names m`. The models it serves must be
// those that `make run`'s curl lines, the example's own and the chat
// page send: with `names m` uncommented, every one of them ("mock") was
// answered 404 model_not_found.
func TestCaddyfileExampleNamesTheModelsItsClientsSend(t *testing.T) {
	example, err := os.ReadFile("Caddyfile.example")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^\s*#\s*names\s+(.+)$`).FindSubmatch(example)
	require.NotNil(t, m, "Caddyfile.example offers a names line")
	names := strings.Fields(string(m[1]))

	sent := map[string][]string{}
	model := regexp.MustCompile(`"model":"([^"]+)"`)
	for _, file := range []string{"Caddyfile.example", "scripts/run.sh"} {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range model.FindAllSubmatch(raw, -1) {
			sent[file] = append(sent[file], string(m[1]))
		}
	}
	page, err := os.ReadFile("web/chat.html")
	require.NoError(t, err)
	dm := regexp.MustCompile(`get\("model"\) \|\| "([^"]+)"`).FindSubmatch(page)
	require.NotNil(t, dm, "the chat page has a default model")
	sent["web/chat.html"] = []string{string(dm[1])}

	for file, models := range sent {
		require.NotEmpty(t, models, file)
		for _, m := range models {
			assert.Contains(t, names, m, "%s sends model %q, which the example's names line does not serve", file, m)
		}
	}
}
