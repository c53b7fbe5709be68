package integration

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

const (
	// buildTimeout bounds the one go build of the Caddy binary; a cold
	// build takes minutes on a small machine.
	buildTimeout = 15 * time.Minute
	// startTimeout bounds the wait for a Caddy process to serve.
	startTimeout = 30 * time.Second
	// exitTimeout bounds the wait for a Caddy process to exit after
	// SIGTERM: its grace period plus a margin for a loaded machine.
	exitTimeout = 30 * time.Second
	// startAttempts bounds the retries when a free port is taken before
	// Caddy binds it.
	startAttempts = 3
	logTailBytes  = 8 << 10
)

// workDir holds the Caddy binary; TestMain removes it.
var workDir string

var build struct {
	once sync.Once
	bin  string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fair-queue-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		os.Exit(1)
	}
	workDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// caddyBinary builds cmd/caddy the first time a test needs it, with the
// go command running the tests (go test puts its GOROOT/bin first in
// PATH), and fails every test that needs it if the build failed.
func caddyBinary(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			build.err = fmt.Errorf("find the go command: %w", err)
			return
		}
		bin := filepath.Join(workDir, "caddy")
		cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/caddy")
		cmd.Dir = ".." // the module root: tests run in their package directory
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		if err := cmd.Start(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/caddy: %w", err)
			return
		}
		timer := time.AfterFunc(buildTimeout, func() { _ = cmd.Process.Kill() })
		err = cmd.Wait()
		timer.Stop()
		if err != nil {
			build.err = fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, out.String())
			return
		}
		fmt.Fprintf(os.Stderr, "integration: built %s in %v\n", bin, time.Since(start).Round(time.Millisecond))
		build.bin = bin
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// Caddy is a Caddy process owned by a test, serving one site on a free
// loopback port, with its admin endpoint on another.
type Caddy struct {
	t         *testing.T
	name      string
	dir       string
	logPath   string
	httpPort  int
	adminPort int
	grace     time.Duration

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // the result of Wait, readable after done
}

// CaddyOptions configure StartCaddy.
type CaddyOptions struct {
	// GracePeriod is the global grace_period: how long an exiting or
	// reloading Caddy lets running requests finish. Default 2s.
	GracePeriod time.Duration
}

// StartCaddy starts Caddy serving site, the body of a site block
// (directives such as fair_queue and reverse_proxy), and waits until it
// serves. The process is killed when the test ends, and its log tail is
// printed if the test failed.
func StartCaddy(t *testing.T, name, site string, opts CaddyOptions) *Caddy {
	t.Helper()
	bin := caddyBinary(t)
	c := &Caddy{t: t, name: name, dir: t.TempDir(), grace: opts.GracePeriod}
	if c.grace == 0 {
		c.grace = 2 * time.Second
	}
	c.logPath = filepath.Join(c.dir, "caddy.log")
	t.Cleanup(func() {
		c.kill()
		switch {
		case os.Getenv("INTEGRATION_CADDY_LOGS") != "":
			t.Logf("--- %s (caddy on :%d) log:\n%s", c.name, c.httpPort, c.Log())
		case t.Failed():
			t.Logf("--- %s (caddy on :%d) log tail:\n%s", c.name, c.httpPort, c.LogTail())
		}
	})
	var err error
	for range startAttempts {
		c.httpPort, c.adminPort = freePort(t), freePort(t)
		if err = c.start(bin, site); err == nil {
			return c
		}
		c.kill()
		if !strings.Contains(c.LogTail(), "address already in use") {
			break
		}
	}
	t.Fatalf("start %s: %v", name, err)
	return nil
}

// URL returns the base URL of the site, http://127.0.0.1:port.
func (c *Caddy) URL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(c.httpPort))
}

// Caddyfile returns the whole Caddyfile serving site on c's ports.
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
`, c.adminPort, c.grace, c.httpPort, filepath.Join(c.dir, "data"), c.httpPort, site)
}

func (c *Caddy) start(bin, site string) error {
	path := filepath.Join(c.dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(c.Caddyfile(site)), 0o644); err != nil {
		return err
	}
	logFile, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor
	fmt.Fprintf(logFile, "--- integration: starting %s on :%d (admin :%d)\n", c.name, c.httpPort, c.adminPort)

	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(),
		"HOME="+c.dir,
		"XDG_CONFIG_HOME="+filepath.Join(c.dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(c.dir, "data"),
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec %s: %w", bin, err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done, c.err = cmd, done, nil
	c.mu.Unlock()
	go func() {
		err := cmd.Wait()
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(done)
	}()
	return c.waitReady(done)
}

// waitReady polls until the admin endpoint answers and the site port
// accepts connections.
func (c *Caddy) waitReady(done chan struct{}) error {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("caddy exited before serving: %v", c.exitErr())
		default:
		}
		if resp, err := client.Get(c.adminURL() + "/config/"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.httpPort)), time.Second); err == nil {
				conn.Close()
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("caddy not serving within %v", startTimeout)
}

func (c *Caddy) adminURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(c.adminPort))
}

// Load replaces the running config with the Caddyfile serving site, as
// an operator's `caddy reload` does: POST /load to the admin endpoint.
func (c *Caddy) Load(site string) error {
	req, err := http.NewRequest(http.MethodPost, c.adminURL()+"/load", strings.NewReader(c.Caddyfile(site)))
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
	return nil
}

// Signal sends sig to the Caddy process.
func (c *Caddy) Signal(sig syscall.Signal) {
	c.t.Helper()
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	select {
	case <-done:
		c.t.Fatalf("signal %s: %s has exited: %v", sig, c.name, c.exitErr())
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("signal %s to %s: %v", sig, c.name, err)
	}
}

// Exited returns a channel closed when the process has exited.
func (c *Caddy) Exited() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// Stop sends SIGTERM and waits for the process to exit, failing the test
// if it does not within exitTimeout (it is then killed).
func (c *Caddy) Stop() {
	c.t.Helper()
	c.Signal(syscall.SIGTERM)
	c.WaitExit(exitTimeout)
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
		c.kill()
		c.t.Fatalf("%s did not exit within %v; killed", c.name, d)
	}
	if err := c.exitErr(); err != nil {
		c.t.Errorf("%s exited with %v", c.name, err)
	}
}

func (c *Caddy) exitErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// kill sends SIGKILL to the process group of a running Caddy and waits
// for it.
func (c *Caddy) kill() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return // reaped: its group ID may be someone else's now
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// LogTail returns the end of the process's stdout and stderr.
func (c *Caddy) LogTail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// Log returns the whole log of the process so far.
func (c *Caddy) Log() string {
	b, _ := os.ReadFile(c.logPath)
	return string(b)
}

// StartMockLLM starts an in-process mock LLM upstream and returns it and
// its host:port, for reverse_proxy.
func StartMockLLM(t *testing.T, cfg mockllm.Config) (*mockllm.Server, string) {
	t.Helper()
	m := mockllm.New(cfg)
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	return m, strings.TrimPrefix(srv.URL, "http://")
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// eventually polls cond every 20ms until it holds or d passes, and
// reports whether it held.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
