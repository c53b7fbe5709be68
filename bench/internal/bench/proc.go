package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process the bench started: one server of a system
// under test. Stop ends it; Procs.StopAll ends every one still running.
type Proc struct {
	// Name names the process and its log file.
	Name string
	// Log is the path of its stdout and stderr.
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Procs owns the processes of a run, so that each one is stopped however
// the run ends.
type Procs struct {
	dir  string
	mu   sync.Mutex
	live []*Proc
}

// NewProcs returns an owner whose processes log into dir.
func NewProcs(dir string) *Procs { return &Procs{dir: dir} }

// Start runs bin with args, its output going to <dir>/<name>.log. The
// process gets its own process group (a Ctrl-C at the terminal reaches
// the bench, which stops it in order) and is killed if the bench dies.
func (ps *Procs) Start(name, bin string, args ...string) (*Proc, error) {
	logPath := filepath.Join(ps.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.live = append(ps.live, p)
	ps.mu.Unlock()
	return p, nil
}

// PID returns the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process group, waits up to grace, then kills
// the group. It is safe to call more than once.
func (p *Proc) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
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

// WaitListen waits until addr accepts TCP connections, the process ends,
// or timeout passes.
func (p *Proc) WaitListen(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.Exited() {
			return fmt.Errorf("%s exited at startup (%v): %s", p.Name, p.err, tail(p.Log, 600))
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not listen on %s within %s: %s", p.Name, addr, timeout, tail(p.Log, 600))
}

// tail returns the last n bytes of a file, on one line.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return strings.Join(strings.Fields(string(data)), " ")
}

// FreePorts returns n distinct free loopback ports. They are free when
// returned; a process started soon after binds them.
func FreePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

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
