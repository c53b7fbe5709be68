package harness

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Proc is a child process with its stdout and stderr in a log file, in a
// process group of its own. Its owner stops it: Stop, Kill, or a test's
// cleanup.
type Proc struct {
	// Name names the process in errors.
	Name string
	// Log is the path of its stdout and stderr.
	Log string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // the result of Wait, readable after done
}

// StartProc starts cmd, its output appended to the file at logPath
// (created if missing), in a process group of its own that is killed if
// this process dies (on Linux). cmd's Stdout, Stderr and SysProcAttr are
// set here.
func StartProc(name, logPath string, cmd *exec.Cmd) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own descriptor
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process ID.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done returns a channel closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns the result of waiting for the process: nil while it runs
// and after a clean exit.
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Signal sends sig to the process alone, not its group.
func (p *Proc) Signal(sig os.Signal) error {
	if p.Exited() {
		return fmt.Errorf("signal %s: %s has exited: %v", sig, p.Name, p.err)
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends SIGTERM to the process group, waits up to grace, then kills
// the group. It is safe to call more than once.
func (p *Proc) Stop(grace time.Duration) {
	if p.Exited() {
		return // reaped: its group ID may be someone else's now
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.Kill()
	}
}

// Kill sends SIGKILL to the process group and waits for the process. It
// is safe to call more than once.
func (p *Proc) Kill() {
	if p.Exited() {
		return // reaped: its group ID may be someone else's now
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.done
}

// WaitListen waits until addr accepts TCP connections, the process ends,
// ctx is done, or timeout passes.
func (p *Proc) WaitListen(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.Exited() {
			return fmt.Errorf("%s exited at startup (%v): %s", p.Name, p.err, OneLine(LogTail(p.Log, 600)))
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not listen on %s within %s: %s", p.Name, addr, timeout, OneLine(LogTail(p.Log, 600)))
}

// LogTail returns about the last n bytes of the file at path, from the
// start of a line.
func LogTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// OneLine returns s with every run of white space made one space, for a
// log tail inside an error message.
func OneLine(s string) string {
	return string(bytes.Join(bytes.Fields([]byte(s)), []byte(" ")))
}

// FreePorts returns n distinct loopback TCP ports that were free a
// moment ago; a process started soon after binds them.
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
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
