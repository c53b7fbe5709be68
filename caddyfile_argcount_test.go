package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// An option given too many or too few values names itself and what it
// takes, not only the value after which the line went wrong: `permits 4
// 5` said "wrong argument count or unexpected line ending after '5'",
// which leaves the operator to find which option of the line is meant.
func TestCaddyfileArgumentCountErrorsNameTheOption(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"permits with two values", "permits 4 5", "permits: wrong argument count, want one value, at Testfile:2"},
		{"permits without value", "permits", "permits: wrong argument count, want one value, at Testfile:2"},
		{"max wait with two values", "permits 1\nmax_wait 20 s", "max_wait: wrong argument count, want one value, at Testfile:3"},
		{"tenant with two values", "permits 1\ntenant X-Tenant Id", "tenant: wrong argument count, want one value, at Testfile:3"},
		{"flag with a value", "permits 1\nsse_keepalive 1s\nsse_queue_events on", "sse_queue_events: wrong argument count, want no value, at Testfile:4"},
		{"cost without mode", "permits 1\ntenant x\ncost", "cost: wrong argument count, want <mode> [<max>], at Testfile:4"},
		{"redis with two urls", "permits 1\nredis redis://a redis://b", "redis: wrong argument count, want at most one url, at Testfile:3"},
		{"redis address without value", "permits 1\nredis {\naddress\n}", "address: wrong argument count, want <host:port>..., at Testfile:4"},
		{"tls with a value", "permits 1\nredis {\ntls yes\n}", "tls: wrong argument count, want no value, at Testfile:4"},
		{"names without value", "names", "names: wrong argument count, want <name>..., at Testfile:2"},
		{"upstream without permits", "upstream 10.0.0.5:8000", "upstream: wrong argument count, want <dial address> <permits> [kv_tokens <n>], at Testfile:2"},
		{"requeue on without status", "upstream a:1 1\nrequeue_on", "requeue_on: wrong argument count, want <status>..., at Testfile:3"},
		{"reject stream field without template", "permits 1\nredis\nreject_stream a {\nfield conversation\n}", "field: wrong argument count, want <name> <template>, at Testfile:5"},
		{"adaptive target without value", "permits 1\nadaptive {\ntarget_ttft\n}", "target_ttft: wrong argument count, want one value, at Testfile:4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.wantErr)
		})
	}
}
