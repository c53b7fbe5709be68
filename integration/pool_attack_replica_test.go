package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
)

// attackRefusal is the body of a replica's refusal: a client that sees
// it was passed an answer the pool should have requeued.
const attackRefusal = "attack-replica-refusal"

// attackReplica is an upstream that counts what runs on it, from the
// moment its handler starts to the moment it returns (refusals and
// cut answers included): requests and the max_tokens of their bodies.
// Each request draws what it does from the replica's odds.
type attackReplica struct {
	t    *testing.T
	addr string
	srv  *httptest.Server

	mu       sync.Mutex
	rng      *rand.Rand
	running  map[*http.Request]int // the requests it runs -> their max_tokens
	most     int
	mostTok  int
	refusals map[string]int // request id -> refusals it got here
	arrivals []attackArrival
	// odds, in percent: a 429 with Retry-After, a 503 without, a
	// connection closed before any header, a stream cut halfway, a 503
	// whose body stalls until the proxy gives up on it.
	refuse429, refuse503, reset, cut, stall int
}

// attackArrival is what a replica ran, its arrival included, when a
// request arrived: the requests it ran for a client still there (one
// whose client left is the abort grace's, see
// TestDepartedClientsNeverReachTheUpstream), their tokens, and the ids
// of all.
type attackArrival struct {
	at              time.Time
	running, tokens int
	ids             []string
}

func startAttackReplica(t *testing.T, seed int64) *attackReplica {
	r := &attackReplica{t: t, addr: fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		rng: rand.New(rand.NewSource(seed)), refusals: make(map[string]int), running: make(map[*http.Request]int)}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *attackReplica) start() {
	r.t.Helper()
	var ln net.Listener
	var err error
	require.True(r.t, eventually(5*time.Second, func() bool {
		ln, err = net.Listen("tcp", r.addr)
		return err == nil
	}), "listen on %s: %v", r.addr, err)
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(r.serve))
	r.srv.Listener.Close()
	r.srv.Listener = ln
	r.srv.Start()
}

// stop closes the listener and every connection, as a crashed server.
func (r *attackReplica) stop() {
	if r.srv != nil {
		r.srv.CloseClientConnections()
		r.srv.Close()
		r.srv = nil
	}
}

func (r *attackReplica) setOdds(refuse429, refuse503, reset, cut, stall int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuse429, r.refuse503, r.reset, r.cut, r.stall = refuse429, refuse503, reset, cut, stall
}

// peaks returns the most requests and tokens run at once.
func (r *attackReplica) peaks() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.most, r.mostTok
}

func (r *attackReplica) refusedTimes(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refusals[id]
}

func (r *attackReplica) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var b struct {
		MaxTokens int  `json:"max_tokens"`
		Stream    bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &b)
	id := req.Header.Get("X-Attack-Id")
	r.mu.Lock()
	r.running[req] = b.MaxTokens
	a := attackArrival{at: time.Now()}
	for q, tok := range r.running {
		a.ids = append(a.ids, q.Header.Get("X-Attack-Id"))
		if q.Context().Err() == nil {
			a.running++
			a.tokens += tok
		}
	}
	r.most = max(r.most, a.running)
	r.mostTok = max(r.mostTok, a.tokens)
	r.arrivals = append(r.arrivals, a)
	draw := r.rng.Intn(100)
	odds := []int{r.refuse429, r.refuse503, r.reset, r.cut, r.stall}
	r.mu.Unlock()
	// ended takes the request out of those it runs, before the
	// connection closes where it resets it: the proxy releases its
	// permit as soon as it sees the close.
	ended := func() {
		r.mu.Lock()
		delete(r.running, req)
		r.mu.Unlock()
	}
	defer ended()
	act := -1
	for i, o := range odds {
		if draw < o {
			act = i
			break
		}
		draw -= o
	}
	time.Sleep(5 * time.Millisecond)
	switch act {
	case 0, 1, 4:
		r.mu.Lock()
		r.refusals[id]++
		r.mu.Unlock()
		status := http.StatusTooManyRequests
		if act == 0 {
			w.Header().Set("Retry-After", "1")
		} else {
			status = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if act == 4 {
			_, _ = io.WriteString(w, `{"error":`)
			_ = http.NewResponseController(w).Flush()
			<-req.Context().Done()
			return
		}
		_, _ = io.WriteString(w, `{"error":{"message":"`+attackRefusal+`"}}`)
		return
	case 2:
		conn, _, err := http.NewResponseController(w).Hijack()
		ended()
		if err == nil {
			_ = conn.(*net.TCPConn).SetLinger(0)
			_ = conn.Close()
		}
		return
	}
	const chunks = 5
	if !b.Stream {
		select { // a model server ends a request whose client left at its next step
		case <-req.Context().Done():
			return
		case <-time.After(chunks * 20 * time.Millisecond):
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[{"message":{"content":"done"}}],"usage":{"prompt_tokens":1,"completion_tokens":5,"total_tokens":6}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i := range chunks {
		if act == 3 && i == 2 {
			conn, _, err := rc.Hijack()
			ended()
			if err == nil {
				_ = conn.(*net.TCPConn).SetLinger(0)
				_ = conn.Close()
			}
			return
		}
		if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i); err != nil {
			return
		}
		_ = rc.Flush()
		select {
		case <-req.Context().Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}
