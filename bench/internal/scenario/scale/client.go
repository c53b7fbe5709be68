package scale

// The scale scenario's client processes: the open-file limit, the
// counters each prints and how the bench reads them.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// RaiseFileLimit raises the soft open-file limit to the hard one. The
// processes the bench starts inherit it.
func RaiseFileLimit() (int, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return int(lim.Cur), err
		}
	}
	return int(lim.Cur), nil
}

// fileLimit returns the soft open-file limit.
func fileLimit() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return int(min(lim.Cur, 1<<30))
}

// clientCounters is a line a client process prints: its counters.
type clientCounters struct {
	Sent     int64          `json:"sent"`
	Granted  int64          `json:"granted"`
	Failed   int64          `json:"failed"`
	Rejected int64          `json:"rejected"`
	Dropped  int64          `json:"dropped"`
	InFlight int64          `json:"in_flight"`
	Final    bool           `json:"final,omitempty"`
	Reasons  map[string]int `json:"reasons,omitempty"`
	// Errors counts the failures by error message (final line only).
	Errors map[string]int `json:"errors,omitempty"`
	Error  string         `json:"error,omitempty"`
}

// RunClient is a client process of the scale scenario: it runs the
// loadgen config in file cfgPath until ctx ends, printing its counters as
// one JSON line every 250 ms and a final one.
func RunClient(ctx context.Context, cfgPath string, out io.Writer) error {
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	var cfg loadgen.Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("%s: %w", cfgPath, err)
	}
	r, err := loadgen.New(cfg)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	snap := func() clientCounters {
		c := r.Counters()
		return clientCounters{Sent: c.Sent.Load(), Granted: c.Granted.Load(), Failed: c.Failed.Load(),
			Rejected: c.Rejected.Load(), Dropped: c.Dropped.Load(), InFlight: c.InFlight.Load()}
	}
	done := make(chan struct{})
	var rep *loadgen.Report
	var runErr error
	go func() {
		defer close(done)
		rep, runErr = r.Run(ctx)
	}()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			_ = enc.Encode(snap())
		case <-done:
			c := snap()
			c.Final = true
			if rep != nil {
				c.Reasons, c.Errors = rep.ByReason, rep.Errors
			}
			if runErr != nil && !errors.Is(runErr, context.Canceled) {
				c.Error = runErr.Error()
			}
			return enc.Encode(c)
		}
	}
}

// parseLastCounters returns the last counters line of a client's output
// (other lines, and a last line cut short, are skipped).
func parseLastCounters(data []byte) (clientCounters, bool) {
	var last clientCounters
	found := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var c clientCounters
		if json.Unmarshal(line, &c) == nil {
			last, found = c, true
		}
	}
	return last, found
}

// readCounters reads the last counters a client process printed.
func readCounters(p *procs.Proc) (clientCounters, bool) {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return clientCounters{}, false
	}
	return parseLastCounters(data)
}
