package caddyfairqueue

import (
	"context"
	"maps"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
)

// One backend's gauges read once for every queue of the process that
// reads them: several queues in front of one backend (a queue per model,
// `name {http.fair_queue.model}`, up to 100 of them) name one
// backend_metrics URL, and vLLM serves /metrics from the process that
// streams its answers, so a read per queue per interval would load it
// with up to 100 reads an interval. A queue's read takes a reading of
// the URL started less than half its interval ago (a queue's reads are an
// interval apart: none takes one reading twice), or waits for the one in
// flight; else it reads. Each
// queue counts the preemptions since its own last reading, as before.
// Only queues of one interval share: it is each read's timeout, and a
// queue with a longer one would get the failures of reads cut at the
// shorter (a backend whose /metrics takes longer than that), or wait for
// a hung read past its own timeout.

// sharedGaugeReads are the last and running reads of each URL, by the
// interval of the queues that share them, and those whose last read
// failed (logged once a streak, for every queue that reads it).
var sharedGaugeReads = struct {
	mu      sync.Mutex
	m       map[gaugeReadKey]*gaugeRead
	failing map[gaugeReadKey]bool
}{m: map[gaugeReadKey]*gaugeRead{}, failing: map[gaugeReadKey]bool{}}

// gaugeReadKey names the reads that queues share: of one URL, under one
// interval (their timeout).
type gaugeReadKey struct {
	url   string
	every time.Duration
}

// gaugeRead is one read of a URL's gauges, shared.
type gaugeRead struct {
	done chan struct{} // closed once read
	at   time.Time     // when it started
	g    backendGauges
	err  error
}

// forgetGaugeReadsAfter is how long a read is kept once nobody takes it
// (a URL no queue reads any more).
const forgetGaugeReadsAfter = time.Minute

// readGaugesShared reads url's gauges as readGauges does (timeout: the
// asking queue's interval), sharing them with the other queues that read
// url every interval (see above). The read runs on its own, not under ctx: a queue that
// stops (a reload) while the others wait for its read ends only its own
// wait. The first read of a failure streak is logged at warn level, the
// read that ends it at info level (logReadStreak), on e's log: once for
// every queue that shares the reads.
func readGaugesShared(ctx context.Context, e *engine, client *http.Client, url string, every time.Duration) (backendGauges, error) {
	sharedGaugeReads.mu.Lock()
	key := gaugeReadKey{url, every}
	r := sharedGaugeReads.m[key]
	if r != nil {
		select {
		case <-r.done:
			if time.Since(r.at) >= every/2 {
				r = nil // too old: read again
			}
		default: // in flight: wait for it
		}
	}
	if r == nil {
		r = &gaugeRead{done: make(chan struct{}), at: time.Now()}
		sharedGaugeReads.m[key] = r
		maps.DeleteFunc(sharedGaugeReads.m, func(k gaugeReadKey, old *gaugeRead) bool {
			select {
			case <-old.done:
				if time.Since(old.at) > forgetGaugeReadsAfter {
					delete(sharedGaugeReads.failing, k)
					return true
				}
				return false
			default:
				return false
			}
		})
		go func() {
			g, err := readGauges(context.Background(), client, url, every)
			sharedGaugeReads.mu.Lock()
			r.g, r.err = g, err
			close(r.done)
			was := sharedGaugeReads.failing[key]
			if err != nil {
				sharedGaugeReads.failing[key] = true
			} else {
				delete(sharedGaugeReads.failing, key)
			}
			sharedGaugeReads.mu.Unlock()
			logReadStreak(e, url, was, err)
		}()
	}
	sharedGaugeReads.mu.Unlock()
	select {
	case <-r.done:
		return r.g, r.err
	case <-ctx.Done():
		return backendGauges{}, ctx.Err()
	}
}

// logReadStreak logs a read of url that failed (err) the first time in a
// row at warn level (a wrong URL or path fails every read: the operator
// must hear of it once, not every interval, nor once per queue), its
// later failures at debug level, and a read that succeeds after failures
// (failing: the last one failed) at info level.
func logReadStreak(e *engine, url string, failing bool, err error) {
	switch {
	case err != nil && failing:
		e.log.Debug("backend gauges unread", zap.String("url", url), zap.Error(err))
	case err != nil:
		e.log.Warn("backend gauges unread; skipped until a read succeeds (adaptive backend_metrics)",
			zap.String("queue", e.name), zap.String("url", url), zap.Error(err))
	case failing:
		e.log.Info("backend gauges read again", zap.String("queue", e.name), zap.String("url", url))
	}
}
