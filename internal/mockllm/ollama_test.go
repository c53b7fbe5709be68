package mockllm

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOllamaChatStreamsNDJSONByDefaultWithCountsAtTheEnd(t *testing.T) {
	srv := httptest.NewServer(New(Config{Tokens: 3, Delay: time.Millisecond}).Handler())
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/api/chat", "application/json", strings.NewReader(`{"model":"llama3","messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
	dec := json.NewDecoder(resp.Body)
	var chunks []map[string]any
	for dec.More() {
		var c map[string]any
		require.NoError(t, dec.Decode(&c))
		chunks = append(chunks, c)
	}
	require.Len(t, chunks, 4)
	assert.Equal(t, map[string]any{"role": "assistant", "content": "tok "}, chunks[0]["message"])
	last := chunks[3]
	assert.Equal(t, true, last["done"])
	assert.Equal(t, 3.0, last["eval_count"])
	assert.Positive(t, last["prompt_eval_count"])
}

func TestOllamaGenerateAnswersWholeWhenStreamIsFalse(t *testing.T) {
	srv := httptest.NewServer(New(Config{Tokens: 2, Delay: time.Millisecond}).Handler())
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/api/generate", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","stream":false}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	var v map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	assert.Equal(t, "tok tok ", v["response"])
	assert.Equal(t, true, v["done"])
	assert.Equal(t, 2.0, v["eval_count"])
}
