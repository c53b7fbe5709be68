package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ProgressConfig configures the live progress line of a run.
type ProgressConfig struct {
	// Every is the time between two lines. Default 500ms.
	Every time.Duration
	// RedisAddr (host:port), when set with Queue, adds the queue depth
	// (the FIFO and fair waiting sets) and the permits held (ZCARD of holders).
	RedisAddr string
	// Queue is the fair_queue name.
	Queue string
	// KeyPrefix is the queue's Redis key prefix. Default "fair_queue".
	KeyPrefix string
	// UpstreamStats is the URL of a mockllm /stats endpoint; when set,
	// the line shows the upstream's in_flight and max_in_flight. It is
	// the one-upstream form of Replicas, used when Replicas is empty.
	UpstreamStats string
	// Replicas are the mockllm replicas of an upstream pool (see
	// ParseReplicas). With several, the line shows each one's requests
	// in flight over its permits and its highest concurrency:
	// "replicas 1/1 2/2 3/3 (max 1 2 3)"; with one, the UpstreamStats form.
	Replicas []Replica
	// Overwrite rewrites one terminal line (\r) instead of printing a line
	// per tick.
	Overwrite bool
}

// Observed holds what the progress monitor saw during a run.
type Observed struct {
	// MaxWaiting is the largest queue depth seen.
	MaxWaiting int64 `json:"max_waiting"`
	// MaxHolders is the largest number of permits held seen.
	MaxHolders int64 `json:"max_holders"`
	// Upstream is the last upstream stats read, with a single upstream
	// (UpstreamStats, or Replicas of one).
	Upstream UpstreamStats `json:"upstream"`
	// Replicas holds the last stats read of each of ProgressConfig's
	// Replicas, in their order (zero for one never read).
	Replicas []UpstreamStats `json:"replicas,omitempty"`
}

// UpstreamStats is the part of mockllm's GET /stats the tools read.
type UpstreamStats struct {
	// InFlight is the number of completions running now.
	InFlight int `json:"in_flight"`
	// MaxInFlight is the highest InFlight since start or reset.
	MaxInFlight int `json:"max_in_flight"`
	// Served and Canceled count completions answered in full and cut
	// short by their client.
	Served   int `json:"served"`
	Canceled int `json:"canceled"`
}

// Monitor prints a progress line of a run at a fixed interval.
type Monitor struct {
	r   *Runner
	w   io.Writer
	cfg ProgressConfig
	rdb *redis.Client
	hc  *http.Client

	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	obs  Observed
}

// StartProgress starts printing progress lines of r to w until Stop.
func StartProgress(r *Runner, w io.Writer, cfg ProgressConfig) *Monitor {
	if cfg.Every <= 0 {
		cfg.Every = 500 * time.Millisecond
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = "fair_queue"
	}
	if len(cfg.Replicas) == 0 && cfg.UpstreamStats != "" {
		cfg.Replicas = []Replica{{Stats: cfg.UpstreamStats}}
	}
	m := &Monitor{
		r: r, w: w, cfg: cfg,
		hc:   &http.Client{Timeout: cfg.Every},
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	if len(cfg.Replicas) > 0 {
		m.obs.Replicas = make([]UpstreamStats, len(cfg.Replicas))
	}
	if cfg.RedisAddr != "" && cfg.Queue != "" {
		m.rdb = redis.NewClient(&redis.Options{
			Addr:        cfg.RedisAddr,
			DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond,
			MaxRetries: -1, PoolSize: 1,
		})
	}
	go m.loop()
	return m
}

// Stop prints a last line, stops the monitor and returns what it saw.
func (m *Monitor) Stop() Observed {
	close(m.stop)
	<-m.done
	if m.rdb != nil {
		_ = m.rdb.Close()
	}
	m.hc.CloseIdleConnections()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.obs
}

func (m *Monitor) loop() {
	defer close(m.done)
	t := time.NewTicker(m.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			m.tick()
			if m.cfg.Overwrite {
				fmt.Fprintln(m.w)
			}
			return
		case <-t.C:
			m.tick()
		}
	}
}

// tick reads the counters and probes and prints one line.
func (m *Monitor) tick() {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Every)
	defer cancel()
	c := m.r.Counters()
	var b strings.Builder
	fmt.Fprintf(&b, "%5.1fs sent %d  in flight %d  granted %d  ok %d  rejected %d  failed %d",
		m.r.Elapsed().Seconds(), c.Sent.Load(), c.InFlight.Load(), c.Granted.Load(),
		c.OK.Load(), c.Rejected.Load(), c.Failed.Load())
	if d := c.Dropped.Load(); d > 0 {
		fmt.Fprintf(&b, "  dropped %d", d)
	}
	if m.rdb != nil {
		tag := "{" + m.cfg.KeyPrefix + ":" + m.cfg.Queue + "}"
		pipe := m.rdb.Pipeline()
		fifo := pipe.ZCard(ctx, tag+":waiting")
		fair := pipe.HLen(ctx, tag+":fticket") // fair tickets waiting
		holders := pipe.ZCard(ctx, tag+":holders")
		if _, err := pipe.Exec(ctx); err != nil {
			b.WriteString("  | redis: " + err.Error())
		} else {
			waiting := fifo.Val() + fair.Val()
			fmt.Fprintf(&b, "  | queue depth %d  permits held %d", waiting, holders.Val())
			m.mu.Lock()
			m.obs.MaxWaiting = max(m.obs.MaxWaiting, waiting)
			m.obs.MaxHolders = max(m.obs.MaxHolders, holders.Val())
			m.mu.Unlock()
		}
	}
	if reps := m.cfg.Replicas; len(reps) > 0 {
		stats, errs := FetchReplicaStats(ctx, m.hc, reps)
		m.mu.Lock()
		for i, err := range errs {
			if err == nil {
				m.obs.Replicas[i] = stats[i]
			}
		}
		if len(reps) == 1 && errs[0] == nil {
			m.obs.Upstream = stats[0]
		}
		m.mu.Unlock()
		switch {
		case len(reps) == 1 && errs[0] != nil:
			b.WriteString("  | upstream: " + errs[0].Error())
		case len(reps) == 1:
			fmt.Fprintf(&b, "  | upstream in flight %d (max %d)", stats[0].InFlight, stats[0].MaxInFlight)
		default:
			b.WriteString("  | " + replicaLine(reps, stats, errs))
			for i, err := range errs {
				if err != nil {
					fmt.Fprintf(&b, "  | replica %d: %v", i+1, err)
				}
			}
		}
	}
	if m.cfg.Overwrite {
		fmt.Fprintf(m.w, "\r\033[K%s", b.String())
	} else {
		fmt.Fprintln(m.w, b.String())
	}
}

// FetchUpstreamStats reads a mockllm GET /stats endpoint.
func FetchUpstreamStats(ctx context.Context, hc *http.Client, url string) (UpstreamStats, error) {
	var st UpstreamStats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return st, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("GET %s: %w", url, err)
	}
	return st, nil
}
