package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
		// Past the first 4 KiB buffer: the buffer doubles, its bytes kept in order.
		{"exactly max_body past the first buffer", 100<<10 + 3, 100<<10 + 3, false, false},
		{"exactly max_body past the first buffer, chunked", 100<<10 + 3, 100<<10 + 3, true, false},
		{"a mebibyte, chunked", 1 << 20, 8 << 20, true, false},
		{"max_body plus one past the first buffer, chunked", 100<<10 + 4, 100<<10 + 3, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload := make([]byte, tc.size)
			for i := range payload {
				payload[i] = byte(i % 251) // bytes out of place show
			}
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

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// A waiting body counts its length against max_waiting_bytes (call.wait):
// the memory it holds while it waits must be that length, not the buffer
// readGrowing doubled to while the body of unknown length arrived. A
// chunked body of 4 MiB + 1 byte was held in an 8 MiB buffer: a client
// sending such bodies made the waiting bodies hold twice
// max_waiting_bytes; and a small chunked body held the whole first
// chunk, 64 KiB: 16 times max_waiting_bytes for chat requests of 4 KiB.
func TestAChunkedBodyHoldsNoMoreThanTheBytesCounted(t *testing.T) {
	for _, size := range []int{0, 100, 4 << 10, bodyChunk + 1, 1<<20 + 1, 4<<20 + 1} {
		payload := bytes.Repeat([]byte("a"), size)
		r := httptest.NewRequest(http.MethodPost, "/", io.MultiReader(bytes.NewReader(payload)))
		r.ContentLength = -1
		r.TransferEncoding = []string{"chunked"}
		got, err := readBody(httptest.NewRecorder(), r, DefaultMaxBody, time.Minute)
		require.NoError(t, err)
		require.Equal(t, payload, got)
		assert.LessOrEqual(t, cap(got), size+size/8,
			"a chunked body of %d bytes (counted as %d waiting bytes) holds a buffer of %d", size, len(got), cap(got))
	}
}
