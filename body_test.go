package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSniffBodyReadsTopLevelStreamAndModel(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       bodyInfo
	}{
		{"stream true", `{"model":"m","stream":true}`, bodyInfo{stream: true, model: "m"}},
		{"stream false", `{"stream":false,"model":"m"}`, bodyInfo{model: "m"}},
		{"stream missing", `{"model":"gpt-4o","messages":[]}`, bodyInfo{model: "gpt-4o"}},
		{"stream first, model last", `{"stream":true,"messages":[{"role":"user","content":"hi"}],"model":"llama"}`, bodyInfo{stream: true, model: "llama"}},
		{"whitespace everywhere", " \n\t{ \"stream\" :\n true , \"model\" : \"m\" }\n", bodyInfo{stream: true, model: "m"}},
		{"nested stream ignored", `{"options":{"stream":true},"messages":[{"stream":true}]}`, bodyInfo{}},
		{"nested model ignored", `{"meta":{"model":"x"}}`, bodyInfo{}},
		{"stream as string is not true", `{"stream":"true"}`, bodyInfo{}},
		{"stream as number is not true", `{"stream":1}`, bodyInfo{}},
		{"model not a string", `{"model":42,"stream":true}`, bodyInfo{stream: true}},
		{"model with escapes", `{"model":"a\"b\\c\u00e9"}`, bodyInfo{model: "a\"b\\c\u00e9"}},
		{"escaped key", `{"str\u0065am":true}`, bodyInfo{stream: true}},
		{"strings holding braces and quotes", `{"prompt":"} { \" ] [","stream":true}`, bodyInfo{stream: true}},
		{"string ending in an escaped backslash", `{"x":"a\\","model":"m"}`, bodyInfo{model: "m"}},
		{"string ending in a backslash, then an escaped quote", `{"x":"a\\\"","model":"m"}`, bodyInfo{model: "m"}},
		{"model ending in an escaped backslash", `{"model":"m\\","stream":true}`, bodyInfo{stream: true, model: "m\\"}},
		{"duplicate key: last wins", `{"stream":true,"stream":false}`, bodyInfo{}},
		{"duplicate model: last wins", `{"model":"a","model":"b"}`, bodyInfo{model: "b"}},
		{"empty object", `{}`, bodyInfo{}},
		{"empty body", ``, bodyInfo{}},
		{"array", `[{"stream":true}]`, bodyInfo{}},
		{"malformed: truncated", `{"stream":true,"model":"m"`, bodyInfo{}},
		{"malformed: bad literal", `{"stream":true,"x":tru}`, bodyInfo{}},
		{"malformed: trailing garbage", `{"stream":true} x`, bodyInfo{}},
		{"not JSON", `stream=true&model=m`, bodyInfo{}},
		{"multipart", "--boundary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--boundary--", bodyInfo{}},
		{"numbers and nulls", `{"n":-1.5e3,"z":null,"t":true,"stream":true,"a":[1,2,{"b":[]}]}`, bodyInfo{stream: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, sniffBody([]byte(tc.body)))
		})
	}
}

func TestSniffBodyReadsTheLargestTopLevelMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"max_tokens", `{"model":"m","max_tokens":512}`, 512},
		{"max_completion_tokens", `{"max_completion_tokens":1024,"model":"m"}`, 1024},
		{"max_output_tokens (Responses API)", `{"input":"hi","max_output_tokens":300}`, 300},
		{"several keys: the largest", `{"max_tokens":10,"max_completion_tokens":2000,"max_output_tokens":30}`, 2000},
		{"absent", `{"model":"m"}`, 0},
		{"nested is ignored", `{"options":{"max_tokens":99},"messages":[{"max_tokens":5}]}`, 0},
		{"zero", `{"max_tokens":0}`, 0},
		{"negative", `{"max_tokens":-5}`, 0},
		{"string", `{"max_tokens":"512"}`, 0},
		{"null", `{"max_tokens":null}`, 0},
		{"fraction rounds up", `{"max_tokens":10.2}`, 11},
		{"exponent", `{"max_tokens":1e3}`, 1000},
		{"huge saturates", `{"max_tokens":1e999}`, maxTokenCount},
		{"duplicate key: last wins", `{"max_tokens":900,"max_tokens":9}`, 9},
		{"after a large prompt", `{"messages":[{"content":"` + strings.Repeat("x", 1<<16) + `"}],"max_tokens":77}`, 77},
		{"malformed JSON", `{"max_tokens":512`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, sniffBody([]byte(tc.body)).maxTokens)
		})
	}
}

func TestSniffBodyFindsStreamAfterAMebibyteOfMessages(t *testing.T) {
	content := strings.Repeat("x", 1<<20)
	body := `{"messages":[{"role":"user","content":"` + content + `"}],"model":"m","stream":true}`
	assert.Equal(t, bodyInfo{stream: true, model: "m"}, sniffBody([]byte(body)))
}

// FuzzSniffBody checks the scanner against encoding/json: for every
// input that is a JSON object, sniffBody reads what a JSON parser reads.
func FuzzSniffBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","stream":true}`, `{"stream":false}`, `{"a":{"stream":true}}`,
		`{"str\u0065am":true}`, `{"model":"\"}"}`, `[1]`, `{"stream":true`, `{}`, ` {"a":[{}],"stream" : true } `,
		`{"max_tokens":12,"max_completion_tokens":1.5e2}`, `{"max_output_tokens":-1}`, `{"max_tokens":"9"}`,
		`{"x":"a\\","model":"m"}`, `{"x":"a\\\"","model":"m"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := sniffBody(b)
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil || m == nil {
			assert.Equal(t, bodyInfo{}, got)
			return
		}
		var want bodyInfo
		want.stream = string(m["stream"]) == "true"
		var model string
		if json.Unmarshal(m["model"], &model) == nil {
			want.model = model
		}
		for _, k := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
			want.maxTokens = max(want.maxTokens, wantTokens(m[k]))
		}
		assert.Equal(t, want, got, "body %q", b)
	})
}

func TestReadBodyRestoresTheSameBytesAndLength(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		limit   int64
		chunked bool
		wantErr bool
	}{
		{"small", 100, 1 << 20, false, false},
		{"one mebibyte", 1 << 20, 8 << 20, false, false},
		{"exactly max_body", 4096, 4096, false, false},
		{"exactly max_body, chunked", 4096, 4096, true, false},
		{"max_body plus one", 4097, 4096, false, true},
		{"max_body plus one, chunked", 4097, 4096, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload := bytes.Repeat([]byte("a"), tc.size)
			var body io.Reader = bytes.NewReader(payload)
			if tc.chunked {
				body = io.MultiReader(body) // hides the length
			}
			r := httptest.NewRequest(http.MethodPost, "/", body)
			if tc.chunked {
				r.ContentLength = -1
				r.TransferEncoding = []string{"chunked"}
			}
			got, err := readBody(httptest.NewRecorder(), r, tc.limit, time.Minute)
			if tc.wantErr {
				var tooLarge *http.MaxBytesError
				require.True(t, errors.As(err, &tooLarge), "error %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, payload, got)
			if !tc.chunked {
				assert.LessOrEqual(t, cap(got), tc.size+1, "a declared body's buffer is its size")
			}
			assert.Equal(t, int64(tc.size), r.ContentLength)
			assert.Empty(t, r.TransferEncoding)
			assert.Equal(t, r.Header.Get("Content-Length"), itoa(tc.size))
			again, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			assert.Equal(t, payload, again, "the next handler reads the same bytes")
			rc, err := r.GetBody()
			require.NoError(t, err)
			retry, _ := io.ReadAll(rc)
			assert.Equal(t, payload, retry, "GetBody gives them again, for retries")
		})
	}
}

// stallingBody is the body of a client that declared more than it sends:
// it gives head, then blocks until closed.
type stallingBody struct {
	head      []byte
	stalled   chan struct{} // closed when the reader asks for more than head
	closed    chan struct{}
	stallOnce sync.Once
	closeOnce sync.Once
}

func newStallingBody(head string) *stallingBody {
	return &stallingBody{head: []byte(head), stalled: make(chan struct{}), closed: make(chan struct{})}
}

func (b *stallingBody) Read(p []byte) (int, error) {
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	b.stallOnce.Do(func() { close(b.stalled) })
	<-b.closed
	return 0, io.ErrClosedPipe
}

func (b *stallingBody) Close() error {
	b.closeOnce.Do(func() { close(b.closed) })
	return nil
}

func TestReadBodyAllocatesForTheBytesThatArriveNotTheDeclaredLength(t *testing.T) {
	const clients, declared = 20, 8 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	errs := make(chan error, clients)
	var bodies []*stallingBody
	for range clients {
		b := newStallingBody(`{"model":"m"`)
		bodies = append(bodies, b)
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body, r.ContentLength = b, declared
		go func() {
			_, err := readBody(httptest.NewRecorder(), r, DefaultMaxBody, time.Minute)
			errs <- err
		}()
		select {
		case <-b.stalled:
		case <-time.After(10 * time.Second):
			t.Fatal("readBody did not read the body")
		}
	}
	runtime.ReadMemStats(&after)
	for _, b := range bodies {
		b.Close()
	}
	for range clients {
		assert.Error(t, <-errs)
	}
	// Before: each reader allocated the declared 8 MiB up front (160 MiB).
	allocated := after.TotalAlloc - before.TotalAlloc
	assert.Less(t, allocated, uint64(declared), "%d readers of 12 bytes each, declared 8 MiB: %d bytes allocated", clients, allocated)
}

func TestReadBodyGivesUpOnABodyThatStallsPastTheTimeout(t *testing.T) {
	// A recorder cannot set a read deadline: the timer closes the body.
	const timeout = 100 * time.Millisecond
	b := newStallingBody(`{"model":"m"`)
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body, r.ContentLength = b, 1000
	start := time.Now()
	errs := make(chan error, 1)
	go func() {
		_, err := readBody(httptest.NewRecorder(), r, DefaultMaxBody, timeout)
		errs <- err
	}()
	select {
	case err := <-errs:
		require.ErrorIs(t, err, errBodyTimeout)
		assert.GreaterOrEqual(t, time.Since(start), timeout)
	case <-time.After(10 * time.Second):
		b.Close()
		t.Fatal("readBody still waits for the stalled body")
	}
}

func TestReadBodyWithoutBody(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	got, err := readBody(httptest.NewRecorder(), r, 10, time.Minute)
	require.NoError(t, err)
	assert.Nil(t, got)
	assert.Equal(t, http.NoBody, r.Body)
}

func TestWantsEventStream(t *testing.T) {
	for accept, want := range map[string]bool{
		"":                                 false,
		"application/json":                 false,
		"text/event-stream":                true,
		"Text/Event-Stream; charset=utf-8": true,
		"application/json, text/event-stream;q=0.5": true,
	} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		assert.Equal(t, want, wantsEventStream(r), accept)
	}
}

// wantTokens is the fuzz oracle's reading of a max tokens value: a
// positive JSON number, rounded up and saturated.
func wantTokens(raw json.RawMessage) int64 {
	var n json.Number
	if len(raw) == 0 || raw[0] == '"' || json.Unmarshal(raw, &n) != nil {
		return 0
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if (err != nil && !errors.Is(err, strconv.ErrRange)) || !(f > 0) {
		return 0
	}
	return int64(math.Ceil(min(f, maxTokenCount)))
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// BenchmarkSniffBody reads the top-level keys of chat requests of LLM
// sizes (the rest of the body is skipped, not decoded).
func BenchmarkSniffBody(b *testing.B) {
	for _, kib := range []int{1, 32} {
		// Prose as clients send it: an escape every 32 bytes or so.
		text := strings.Repeat("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod \\\"tempor\\\" incididunt.\\n", 6)
		msg := strings.Repeat(`{"role":"user","content":"`+text+`"},`, kib*1024/(len(text)+30)+1)
		body := []byte(`{"model":"m","messages":[` + msg[:len(msg)-1] + `],"stream":true,"max_tokens":256}`)
		b.Run(fmt.Sprintf("%.1fKiB", float64(len(body))/1024), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if info := sniffBody(body); !info.stream || info.maxTokens != 256 {
					b.Fatalf("sniffed %+v", info)
				}
			}
		})
	}
}
