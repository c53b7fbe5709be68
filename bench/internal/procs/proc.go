// Package procs starts and observes the bench's processes: an owner
// (Procs) that stops every process it started however a run ends, free
// ports, and what /proc and Redis say about them (CPU time, resident
// memory, established connections, INFO commandstats).
package procs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
)

// Proc is a child process the bench started: one server of a system
// under test, in a process group of its own with its output in Log.
// Stop ends it; Procs.StopAll ends every one still running.
type Proc = harness.Proc

// Procs owns the processes of a run, so that each one is stopped however
// the run ends.
type Procs struct {
	dir  string
	mu   sync.Mutex
	live []*Proc
}

// NewProcs returns an owner whose processes log into dir.
func NewProcs(dir string) *Procs { return &Procs{dir: dir} }

// Start runs bin with args, its output going to <dir>/<name>.log, which
// it truncates first. The process gets its own process group (a Ctrl-C
// at the terminal reaches the bench, which stops it in order) and is
// killed if the bench dies.
func (ps *Procs) Start(name, bin string, args ...string) (*Proc, error) {
	logPath := filepath.Join(ps.dir, name+".log")
	if err := os.Truncate(logPath, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	p, err := harness.StartProc(name, logPath, exec.Command(bin, args...))
	if err != nil {
		return nil, err
	}
	ps.mu.Lock()
	ps.live = append(ps.live, p)
	ps.mu.Unlock()
	return p, nil
}

// StopAll stops every process still running, the latest started first.
func (ps *Procs) StopAll() {
	ps.mu.Lock()
	live := ps.live
	ps.live = nil
	ps.mu.Unlock()
	for i := len(live) - 1; i >= 0; i-- {
		live[i].Stop(5 * time.Second)
	}
}

// Stop stops p and forgets it.
func (ps *Procs) Stop(p *Proc) {
	p.Stop(5 * time.Second)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for i, q := range ps.live {
		if q == p {
			ps.live = append(ps.live[:i], ps.live[i+1:]...)
			break
		}
	}
}

// Tail returns about the last n bytes of a file, on one line.
func Tail(path string, n int) string {
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	return harness.OneLine(harness.LogTail(path, n))
}

// FreePorts returns n distinct free loopback ports. They are free when
// returned; a process started soon after binds them.
func FreePorts(n int) ([]int, error) { return harness.FreePorts(n) }

// RSS returns the resident set size of a process, in bytes.
func RSS(pid int) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "12345 kB"
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024, err
			}
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// Established counts the established TCP connections (IPv4) whose local
// port is port: the clients connected to a server listening there.
func Established(port int) (int, error) {
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	want := fmt.Sprintf(":%04X", port)
	n := 0
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		// sl local_address rem_address st ...; st 01 is ESTABLISHED.
		if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "01" {
			n++
		}
	}
	return n, nil
}
