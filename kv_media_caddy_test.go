package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Through Caddy, media_tokens weighs a prompt's images: with room for
// 2,020 tokens, a request of two images at 1,000 each (2,011 in all)
// leaves no room for a second request of 12, which waits until it ends;
// at 1 token an image both run at once.
func TestMediaTokensThroughCaddyDecideWhatRunsBeside(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	image := `{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}`
	withImages := `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[` + image + `,` + image + `,{"type":"text","text":"abcd"}]}]}`
	for _, tc := range []struct {
		media   int
		waiting int
	}{{1000, 1}, {1, 0}} {
		t.Run(fmt.Sprint("media_tokens ", tc.media), func(t *testing.T) {
			up := newHeldUpstream(t)
			name := fmt.Sprint("media-caddy-", tc.media)
			url := runCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"kv_tokens":2020,"media_tokens":%d,"max_wait":"60s"}`,
				name, tc.media), up.proxy())
			client := &http.Client{}
			first := chat(context.Background(), client, url, withImages)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
			second := chat(context.Background(), client, url, `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"abcd"}]}`)
			require.Eventually(t, func() bool { return int(up.run.Load())+queueWaiting(t, name) == 2 }, 10*time.Second, 5*time.Millisecond)
			time.Sleep(100 * time.Millisecond) // a second request that could run has reached the upstream
			assert.Equal(t, tc.waiting, queueWaiting(t, name), "requests waiting beside the one of two images")
			up.release <- struct{}{}
			up.release <- struct{}{}
			assert.Equal(t, http.StatusOK, got(t, first).status)
			assert.Equal(t, http.StatusOK, got(t, second).status)
			client.CloseIdleConnections()
		})
	}
}
