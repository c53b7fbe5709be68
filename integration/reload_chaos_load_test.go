package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// watchedReplica is a mock model server that records, at each arrival of
// a completion request, the requests already running there: the
// concurrency the request met, and which requests made it, so that the
// oracle can leave out those whose client had already left. It counts a
// request from the moment its handler starts until it returns, which is
// before reverse_proxy sees the end of the answer and releases the
// permit: it never counts less than the upstream runs.
type watchedReplica struct {
	name string
	addr string
	mock *mockllm.Server

	mu       sync.Mutex
	nextID   int
	running  map[int]string // request id -> X-Client-Seq
	arrivals []replicaArrival
	gate     chan struct{} // while open (not nil, not closed), arrivals wait before answering
}

// replicaArrival is one completion request arriving at a replica.
type replicaArrival struct {
	at     time.Time
	seq    string
	others []string // the X-Client-Seq of the requests already running
}

func startWatchedReplica(t *testing.T, name string, cfg mockllm.Config) *watchedReplica {
	t.Helper()
	r := &watchedReplica{name: name, mock: mockllm.New(cfg), running: make(map[int]string)}
	h := r.mock.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/chat/completions" {
			h.ServeHTTP(w, req)
			return
		}
		id, gate := r.arrive(req.Header.Get(mockllm.HeaderClientSeq))
		defer r.leave(id)
		select {
		case <-gate: // closed at once where no gate holds
		case <-req.Context().Done():
			return
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.addr = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// hold makes the requests that arrive from now on wait, counted as
// running, before their answer starts, until the returned release is
// called (also at the test's end): the test's setup then takes as long
// as it does without the first request ending meanwhile.
func (r *watchedReplica) hold(t *testing.T) (release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := make(chan struct{})
	r.gate = g
	var once sync.Once
	release = func() { once.Do(func() { close(g) }) }
	t.Cleanup(release)
	return release
}

func (r *watchedReplica) arrive(seq string) (int, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gate <-chan struct{}
	if r.gate != nil {
		gate = r.gate
	} else {
		closed := make(chan struct{})
		close(closed)
		gate = closed
	}
	others := make([]string, 0, len(r.running))
	for _, s := range r.running {
		others = append(others, s)
	}
	r.arrivals = append(r.arrivals, replicaArrival{at: time.Now(), seq: seq, others: others})
	r.nextID++
	r.running[r.nextID] = seq
	return r.nextID, gate
}

func (r *watchedReplica) leave(id int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.running, id)
}

// Arrivals returns every arrival so far.
func (r *watchedReplica) Arrivals() []replicaArrival {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]replicaArrival(nil), r.arrivals...)
}

// reloadChaosRequest is one request of the reload chaos load: what was
// sent, when its client gave up (if it did), and what came back.
type reloadChaosRequest struct {
	seq      string
	caddy    string
	epoch    int // the latest config loaded when it was sent
	stream   bool
	sent     time.Time
	canceled time.Time // when the client cancelled it; zero if it did not
	Result
}

func (q reloadChaosRequest) String() string {
	c := "no cancel"
	if !q.canceled.IsZero() {
		c = fmt.Sprintf("cancelled after %v", q.canceled.Sub(q.sent).Round(time.Millisecond))
	}
	got := "error: " + fmt.Sprint(q.Err)
	if q.Err == nil {
		body := q.Body
		if len(body) > 80 {
			body = body[:80] + "..."
		}
		got = fmt.Sprintf("%d %s reason=%q body=%q", q.Status, q.Header.Get("Content-Type"), q.Header.Get("Fair-Queue-Reason"), body)
	}
	return fmt.Sprintf("%s to %s (stream %t) sent %s under #%d, %s, done after %v: %s", q.seq, q.caddy, q.stream,
		q.sent.Format("15:04:05.000"), q.epoch, c, q.Done.Sub(q.sent).Round(time.Millisecond), got)
}

// reloadChaosLoad is clients closed-loop clients of one group, each
// sending plain and streamed chat requests, with a tenant header, one
// after another to the group's instances in turn; some cancel theirs
// after a random delay, while it waits or while it streams.
type reloadChaosLoad struct {
	group   string
	targets []*harness.Caddy
	epoch   func() int
	client  *http.Client
	stop    chan struct{}
	wg      sync.WaitGroup

	mu       sync.Mutex
	requests map[string]*reloadChaosRequest
}

// Request shapes and pacing of the load.
const (
	reloadChaosCancelShare = 0.25                   // of requests that their client cancels
	reloadChaosCancelMax   = 600 * time.Millisecond // a cancel comes after 0 to this
	reloadChaosTenants     = 3
	// reloadChaosTimeout bounds a request: max_wait, the answer and a
	// loaded machine's margin. A request that takes longer failed.
	reloadChaosTimeout = 30 * time.Second
)

func startReloadChaosLoad(t *testing.T, group string, seed int64, clients int, targets []*harness.Caddy, epoch func() int) *reloadChaosLoad {
	l := &reloadChaosLoad{group: group, targets: targets, epoch: epoch, client: newClient(t), stop: make(chan struct{}),
		requests: make(map[string]*reloadChaosRequest)}
	t.Cleanup(l.Stop)
	for i := range clients {
		rng := rand.New(rand.NewSource(seed + int64(i)))
		l.wg.Go(func() { l.run(i, rng) })
	}
	return l
}

// Stop stops the clients after their current request and waits for
// them.
func (l *reloadChaosLoad) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// Requests returns the requests sent so far, by X-Client-Seq.
func (l *reloadChaosLoad) Requests() map[string]*reloadChaosRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]*reloadChaosRequest, len(l.requests))
	for k, v := range l.requests {
		c := *v
		out[k] = &c
	}
	return out
}

func (l *reloadChaosLoad) run(client int, rng *rand.Rand) {
	for n := 0; ; n++ {
		select {
		case <-l.stop:
			return
		default:
		}
		c := l.targets[(client+n)%len(l.targets)]
		q := &reloadChaosRequest{seq: fmt.Sprintf("%s-c%d-%d", l.group, client, n), caddy: c.Name(), stream: rng.Intn(2) == 0}
		var cancelAfter time.Duration
		if rng.Float64() < reloadChaosCancelShare {
			cancelAfter = time.Duration(rng.Int63n(int64(reloadChaosCancelMax)))
		}
		ch := Chat{Stream: q.stream, Seq: q.seq, Header: http.Header{"X-Tenant": {fmt.Sprintf("t%d", rng.Intn(reloadChaosTenants))}}}
		l.one(c, q, ch, cancelAfter)
		if q.Err != nil || q.Header.Get("Fair-Queue-Reason") != "" {
			// A rejected client backs off a little, as a real one would.
			select {
			case <-l.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// one sends ch to c and records it in q; a positive cancelAfter cancels
// it then, and records when.
func (l *reloadChaosLoad) one(c *harness.Caddy, q *reloadChaosRequest, ch Chat, cancelAfter time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), reloadChaosTimeout)
	defer cancel()
	q.sent, q.epoch = time.Now(), l.epoch()
	l.mu.Lock()
	l.requests[q.seq] = q
	l.mu.Unlock()
	if cancelAfter > 0 {
		timer := time.AfterFunc(cancelAfter, func() {
			l.mu.Lock()
			q.canceled = time.Now() // before the cancel: the oracle compares it with arrivals
			l.mu.Unlock()
			cancel()
		})
		defer timer.Stop()
	}
	var r Result
	resp, err := l.client.Do(ch.request(ctx, c.URL()))
	if err != nil {
		r = Result{Err: err, Done: time.Now()}
	} else {
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		r = Result{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Err: err, Done: time.Now()}
	}
	l.mu.Lock()
	q.Result = r
	l.mu.Unlock()
}

// verdict says what q got: "served", "reject <reason>", "cancelled" (its
// client left), or "" and why it is none of the well-formed answers.
func (q *reloadChaosRequest) verdict(tokens int) (kind, bad string) {
	if !q.canceled.IsZero() && (q.Err != nil || q.Status == 0) {
		return "cancelled", ""
	}
	if q.Err != nil {
		if !q.canceled.IsZero() {
			return "cancelled", ""
		}
		return "", "failed: " + q.Err.Error()
	}
	ct, reason := q.Header.Get("Content-Type"), q.Header.Get("Fair-Queue-Reason")
	if reason != "" {
		return rejectVerdict(q, ct, reason)
	}
	if q.Status != http.StatusOK {
		return "", fmt.Sprintf("status %d without a fair_queue reason", q.Status)
	}
	if q.stream {
		if !strings.HasPrefix(ct, "text/event-stream") || strings.Count(q.Body, "data: {") != tokens ||
			!strings.HasSuffix(q.Body, "data: [DONE]\n\n") {
			return "", "stream not whole"
		}
		return "served", ""
	}
	var a struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if !strings.HasPrefix(ct, "application/json") || json.Unmarshal([]byte(q.Body), &a) != nil ||
		a.Object != "chat.completion" || len(a.Choices) != 1 || strings.Count(a.Choices[0].Message.Content, "tok") != tokens {
		return "", "answer not whole"
	}
	return "served", ""
}

// rejectVerdict checks a reject of reason: a streamed request's SSE
// error event (200), a plain one's JSON error (429 or 503), each naming
// the reason. Only timeout and store_unavailable (on_store_error
// fail_closed, a store call that timed out on a loaded machine) are
// expected: a reload answers no waiter.
func rejectVerdict(q *reloadChaosRequest, ct, reason string) (kind, bad string) {
	if reason != "timeout" && reason != "store_unavailable" {
		return "", "unexpected reject reason " + reason
	}
	var e apiError
	if q.stream {
		const head = "event: error\ndata: "
		if q.Status != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") || !strings.HasPrefix(q.Body, head) ||
			json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(q.Body, head))), &e) != nil {
			return "", "malformed SSE reject"
		}
	} else if (q.Status != http.StatusTooManyRequests && q.Status != http.StatusServiceUnavailable) ||
		!strings.HasPrefix(ct, "application/json") || json.Unmarshal([]byte(q.Body), &e) != nil {
		return "", "malformed JSON reject"
	}
	if e.Error.Code != reason {
		return "", fmt.Sprintf("reject code %q, reason header %q", e.Error.Code, reason)
	}
	return "reject " + reason, ""
}
