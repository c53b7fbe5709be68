package harness

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// startTimeout bounds the wait for a Caddy process to serve.
	startTimeout = 30 * time.Second
	// ExitTimeout bounds the wait for a Caddy process to exit after
	// SIGTERM in Stop: its grace period plus a margin for a loaded
	// machine.
	ExitTimeout = 30 * time.Second
	// startAttempts bounds the retries when a free port is taken before
	// Caddy binds it.
	startAttempts = 3
	// logTailBytes is how much of a Caddy's log a failed test prints.
	logTailBytes = 8 << 10
)

// Ports are the loopback ports a Caddy serves on.
type Ports struct {
	// HTTP is the site's port.
	HTTP int
	// Admin is the admin endpoint's port.
	Admin int
}

// CaddyOptions configure StartCaddy and StartCaddyfile.
type CaddyOptions struct {
	// GracePeriod is the global grace_period of the Caddyfile that
	// StartCaddy writes: how long an exiting or reloading Caddy lets
	// running requests finish. Default 2s.
	GracePeriod time.Duration
	// Dir is Caddy's working directory, where relative paths of the
	// Caddyfile (a file_server root) start; default the instance's own
	// temporary directory, which is also its HOME.
	Dir string
}

// Caddy is a Caddy process owned by a test, serving on free loopback
// ports. The process is killed when the test ends.
type Caddy struct {
	t         testing.TB
	name      string
	home      string // HOME, the Caddyfile and the log
	logPath   string
	ports     Ports
	grace     time.Duration
	caddyfile func(*Caddy) string // the config for c's ports

	mu   sync.Mutex
	proc *Proc // the latest start attempt
}

// StartCaddy starts Caddy serving site, the body of a site block
// (directives such as fair_queue and reverse_proxy), in the Caddyfile
// that Caddyfile writes around it, and waits until it serves. The
// process is killed when the test ends, and its log tail is printed if
// the test failed.
func StartCaddy(t testing.TB, name, site string, opts CaddyOptions) *Caddy {
	t.Helper()
	return start(t, name, func(c *Caddy) string { return c.Caddyfile(site) }, opts)
}

// StartCaddyfile starts Caddy with the whole Caddyfile that caddyfile
// returns for the ports it is given, global options included: it must
// listen on Ports.HTTP and put its admin endpoint on Ports.Admin. It
// waits until Caddy serves; the process is killed when the test ends.
func StartCaddyfile(t testing.TB, name string, caddyfile func(Ports) string, opts CaddyOptions) *Caddy {
	t.Helper()
	return start(t, name, func(c *Caddy) string { return caddyfile(c.ports) }, opts)
}

func start(t testing.TB, name string, caddyfile func(*Caddy) string, opts CaddyOptions) *Caddy {
	t.Helper()
	bin := CaddyBinary(t)
	c := &Caddy{t: t, name: name, home: t.TempDir(), grace: opts.GracePeriod, caddyfile: caddyfile}
	if c.grace == 0 {
		c.grace = 2 * time.Second
	}
	if opts.Dir == "" {
		opts.Dir = c.home
	}
	c.logPath = filepath.Join(c.home, "caddy.log")
	t.Cleanup(func() {
		c.Kill()
		switch {
		case os.Getenv("INTEGRATION_CADDY_LOGS") != "":
			t.Logf("--- %s (caddy on :%d) log:\n%s", c.name, c.ports.HTTP, c.Log())
		case t.Failed():
			t.Logf("--- %s (caddy on :%d) log tail:\n%s", c.name, c.ports.HTTP, c.LogTail())
		}
	})
	var err error
	for range startAttempts {
		var ports []int
		if ports, err = FreePorts(2); err != nil {
			break
		}
		c.ports = Ports{HTTP: ports[0], Admin: ports[1]}
		if err = c.start(bin, opts.Dir); err == nil {
			return c
		}
		c.Kill()
		if !strings.Contains(c.LogTail(), "address already in use") {
			break
		}
	}
	t.Fatalf("start %s: %v", name, err)
	return nil
}

func (c *Caddy) start(bin, dir string) error {
	path := filepath.Join(c.home, "Caddyfile")
	if err := os.WriteFile(path, []byte(c.caddyfile(c)), 0o644); err != nil {
		return err
	}
	if err := appendLine(c.logPath, fmt.Sprintf("--- harness: starting %s on :%d (admin :%d)", c.name, c.ports.HTTP, c.ports.Admin)); err != nil {
		return err
	}
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"HOME="+c.home,
		"XDG_CONFIG_HOME="+filepath.Join(c.home, "config"),
		"XDG_DATA_HOME="+filepath.Join(c.home, "data"),
	)
	p, err := StartProc(c.name, c.logPath, cmd)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.proc = p
	c.mu.Unlock()
	return c.waitReady(p)
}

// appendLine appends line and a newline to the file at path.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// waitReady polls until the admin endpoint answers and the site port
// accepts connections.
func (c *Caddy) waitReady(p *Proc) error {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.Done():
			return fmt.Errorf("caddy exited before serving: %v", p.Err())
		default:
		}
		if resp, err := client.Get(c.AdminURL() + "/config/"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if conn, err := net.DialTimeout("tcp", c.hostPort(c.ports.HTTP), time.Second); err == nil {
				conn.Close()
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("caddy not serving within %v", startTimeout)
}

func (c *Caddy) hostPort(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// Name returns the name the test gave this instance.
func (c *Caddy) Name() string { return c.name }

// Ports returns the ports this instance serves on.
func (c *Caddy) Ports() Ports { return c.ports }

// URL returns the base URL of the site, http://127.0.0.1:port.
func (c *Caddy) URL() string { return "http://" + c.hostPort(c.ports.HTTP) }

// AdminURL returns the base URL of the admin endpoint.
func (c *Caddy) AdminURL() string { return "http://" + c.hostPort(c.ports.Admin) }

// PID returns the process ID of the running Caddy.
func (c *Caddy) PID() int { return c.current().PID() }

func (c *Caddy) current() *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc
}

// Caddyfile returns the whole Caddyfile serving site on c's ports, with
// its grace period, automatic HTTPS off and its storage in c's own
// directory.
func (c *Caddy) Caddyfile(site string) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	grace_period %s
	auto_https off
	http_port %d
	persist_config off
	storage file_system %s
}

:%d {
	log
%s
}
`, c.ports.Admin, c.grace, c.ports.HTTP, filepath.Join(c.home, "data"), c.ports.HTTP, site)
}

// Load replaces the running config with the Caddyfile serving site, as
// an operator's `caddy reload` does: POST /load to the admin endpoint.
// On Linux it returns once the old config's server has closed its
// listeners (awaitOldListenerClosed); elsewhere it may return before.
func (c *Caddy) Load(site string) error {
	req, err := http.NewRequest(http.MethodPost, c.AdminURL()+"/load", strings.NewReader(c.Caddyfile(site)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("load %s: %w", c.name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("load %s: %s: %s", c.name, resp.Status, body)
	}
	return c.awaitOldListenerClosed()
}

// awaitOldListenerClosed waits until one socket listens on c's HTTP
// port. Caddy answers a load as its old servers start shutting down,
// before they close their listeners, and each config listens on a
// socket of its own (SO_REUSEPORT): until the old one closes, the
// kernel hands new connections to either, so that a request sent right
// after the load may reach the old config (its settings, its reject
// answers). Where the sockets cannot be read (not Linux) it returns at
// once.
func (c *Caddy) awaitOldListenerClosed() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, ok := tcpListeners(c.ports.HTTP)
		if !ok || n <= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("load %s: %d sockets still listen on port %d 10s after the load", c.name, n, c.ports.HTTP)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Signal sends sig to the Caddy process, failing the test if it has
// exited.
func (c *Caddy) Signal(sig syscall.Signal) {
	c.t.Helper()
	if err := c.current().Signal(sig); err != nil {
		c.t.Fatal(err)
	}
}

// Exited returns a channel closed when the process has exited.
func (c *Caddy) Exited() <-chan struct{} { return c.current().Done() }

// Stop sends SIGTERM and waits for the process to exit, failing the test
// if it does not within ExitTimeout (it is then killed).
func (c *Caddy) Stop() {
	c.t.Helper()
	c.Signal(syscall.SIGTERM)
	c.WaitExit(ExitTimeout)
}

// WaitExit waits for the process to exit and fails the test if it does
// not within d, or exits with an error.
func (c *Caddy) WaitExit(d time.Duration) {
	c.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-c.Exited():
	case <-timer.C:
		c.Kill()
		c.t.Fatalf("%s did not exit within %v; killed", c.name, d)
	}
	if err := c.current().Err(); err != nil {
		c.t.Errorf("%s exited with %v", c.name, err)
	}
}

// Kill sends SIGKILL to the process group of a running Caddy and waits
// for it: a crash, with no grace period.
func (c *Caddy) Kill() {
	if p := c.current(); p != nil {
		p.Kill()
	}
}

// LogTail returns the end of the process's stdout and stderr.
func (c *Caddy) LogTail() string { return LogTail(c.logPath, logTailBytes) }

// Log returns the whole log of the process so far.
func (c *Caddy) Log() string {
	b, _ := os.ReadFile(c.logPath)
	return string(b)
}
