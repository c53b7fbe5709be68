package caddyfairqueue

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two handlers of one config that name one queue but disagree on a
// block or a list of them are refused naming the options inside, as the
// operator wrote them: the error showed Go's dump of the engine's
// structs, `[{10.0.0.1:8000 2 0}]` (which number is the permits?) and
// `{TargetTTFT:1s Floor:0 ...}`.
// adaptiveLines is `permits 4` and an adaptive block of the options
// given, indented as in a handle block.
func adaptiveLines(options ...string) string {
	return "\t\t\tpermits 4\n\t\t\tadaptive {\n\t\t\t\t" + strings.Join(options, "\n\t\t\t\t") + "\n\t\t\t}"
}

func TestHandlersThatDisagreeOnABlockAreToldItsOptions(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name, a, b    string
		want, notWant []string
	}{
		{"upstreams", "\t\t\tupstream 10.0.0.1:8000 2", "\t\t\tupstream 10.0.0.1:8000 3 kv_tokens 5000",
			[]string{"upstreams (", "permits: 2", "permits: 3", "kv_tokens: 5000", "dial: 10.0.0.1:8000"}, []string{"{10.0.0.1:8000 2 0}"}},
		{"adaptive", adaptiveLines("target_ttft 1s"), adaptiveLines("target_ttft 2s", "floor 0.5"),
			[]string{"adaptive (", "target_ttft: 1s", "target_ttft: 2s", "floor: 0.5"}, []string{"TargetTTFT", "Floor:"}},
		{"adaptive on one only", "\t\t\tpermits 4", adaptiveLines("target_ttft 2s"),
			[]string{"adaptive (off and {target_ttft: 2s})"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validate(t, ":8080 {\n\thandle /a {\n\t\tfair_queue {\n\t\t\tname shared\n"+tc.a+"\n\t\t}\n\t\trespond ok\n\t}\n\n"+
				"\thandle /b {\n\t\tfair_queue {\n\t\t\tname shared\n"+tc.b+"\n\t\t}\n\t\trespond ok\n\t}\n}\n")
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			for _, w := range tc.notWant {
				assert.NotContains(t, err.Error(), w, "no Go dump")
			}
		})
	}
}
