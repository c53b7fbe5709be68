package caddyfairqueue

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The records a reject stream buffers while Redis is slow (at most
// 1024) hold each field's value cut to 4 KiB, not the value it was cut
// from: a flood of rejects during a Redis stall, each with a field
// taken from a header of Caddy's default 16 KiB max_header_bytes, holds
// about 4 KiB a field a record. Before, a record kept the whole value
// behind the cut, 16 KiB (and 1 MiB a record with a max_header_bytes of
// 1 MiB: a GiB for the buffer).
func TestRejectStreamRecordsHoldTheirCutValuesOnly(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	s := newTestRejectStream(t, rds.Addr(), &RejectStreamConfig{Key: "busy",
		Fields: map[string]string{"conversation": "{http.request.header.X-Conversation-Id}"}}, zap.NewNop())
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonQueueFull}
	s.add(caddy.NewReplacer(), "q", rej) // starts the worker, which then waits on Redis
	rds.Freeze()
	t.Cleanup(rds.Thaw)

	const n = rejectStreamBuffer
	value := strings.Repeat("c", 16<<10)
	before := heldMemory()
	for range n {
		repl := caddy.NewReplacer()
		repl.Set("http.request.header.X-Conversation-Id", value) // each request's own header value
		s.add(repl, "q", rej)
	}
	held := heldMemory() - before
	t.Logf("each buffered record holds %d bytes", held/n)
	assert.Less(t, held, int64(n*2*maxRejectFieldLen), "the buffered records hold more than twice their cut values")
	rds.Thaw()
}
