// Package e2etest runs what the end-to-end tests in e2e/ look at from the
// outside: the Caddy binary of this checkout (built once per test
// binary), Caddy processes on free loopback ports, the mock LLM, and
// streaming requests that hold a queue's permits. The tests build with
// the e2e tag (make e2e); this package builds without it so that go vet
// ./... sees it.
package e2etest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	logTailBytes = 8 << 10
)

// workDir holds the Caddy binary; Main removes it.
var workDir string

var build struct {
	once sync.Once
	bin  string
	err  error
}

// Main runs the tests of m with a work directory for the Caddy binary,
// and removes it afterwards; call it from TestMain.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fair-queue-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2etest:", err)
		return 1
	}
	workDir = dir
	defer os.RemoveAll(dir)
	return m.Run()
}

// RepoRoot returns the module root: the nearest directory above the
// working directory (a test's package directory) that holds go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("e2etest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// CaddyBinary builds ./cmd/caddy the first time a test needs it, with
// the go command running the tests (go test puts its GOROOT/bin first in
// PATH), and fails every test that needs it if the build failed.
func CaddyBinary(t testing.TB) string {
	t.Helper()
	root := RepoRoot(t)
	build.once.Do(func() {
		if workDir == "" {
			build.err = errors.New("e2etest: call e2etest.Main from TestMain")
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			build.err = fmt.Errorf("find the go command: %w", err)
			return
		}
		bin := filepath.Join(workDir, "caddy")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, "./cmd/caddy")
		cmd.Dir = root
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, out)
			return
		}
		fmt.Fprintf(os.Stderr, "e2etest: built %s in %v\n", bin, time.Since(start).Round(time.Millisecond))
		build.bin = bin
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// StartMockLLM starts an in-process mock LLM and returns it and its
// host:port, for reverse_proxy.
func StartMockLLM(t testing.TB, cfg mockllm.Config) (*mockllm.Server, string) {
	t.Helper()
	m := mockllm.New(cfg)
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	return m, strings.TrimPrefix(srv.URL, "http://")
}

// Caddy is a Caddy process owned by a test.
type Caddy struct {
	// URL is the site's base URL, http://127.0.0.1:<HTTPPort>.
	URL string
	// AdminURL is the admin endpoint's base URL.
	AdminURL string

	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
}

// Config is a whole Caddyfile, and the ports it serves on, for StartCaddy.
type Config struct {
	// Caddyfile is the config, global options included; it must listen
	// on HTTPPort and put its admin endpoint on AdminPort.
	Caddyfile string
	// HTTPPort and AdminPort are the ports StartCaddy waits for.
	HTTPPort, AdminPort int
	// Dir is Caddy's working directory, where relative paths of the
	// Caddyfile (a file_server root) start; default a new temporary one.
	Dir string
}

// StartCaddy runs Caddy with cfg and waits until it serves. The process
// is killed when the test ends; its log is printed if the test failed.
func StartCaddy(t testing.TB, cfg Config) *Caddy {
	t.Helper()
	bin := CaddyBinary(t)
	home := t.TempDir()
	if cfg.Dir == "" {
		cfg.Dir = home
	}
	path := filepath.Join(home, "Caddyfile")
	if err := os.WriteFile(path, []byte(cfg.Caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &Caddy{
		URL:      "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.HTTPPort)),
		AdminURL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.AdminPort)),
		logPath:  filepath.Join(home, "caddy.log"),
		done:     make(chan struct{}),
	}
	logFile, err := os.Create(c.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	c.cmd = exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	c.cmd.Dir = cfg.Dir
	c.cmd.Env = append(os.Environ(),
		"HOME="+home,
		"XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_DATA_HOME="+filepath.Join(home, "data"),
	)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("exec %s: %v", bin, err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("--- caddy log tail:\n%s", c.LogTail())
		}
	})
	if err := c.waitReady(); err != nil {
		t.Fatalf("start caddy: %v\n%s", err, c.LogTail())
	}
	return c
}

// waitReady polls until the admin endpoint answers and the site port
// accepts connections.
func (c *Caddy) waitReady() error {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	site := strings.TrimPrefix(c.URL, "http://")
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-c.done:
			return errors.New("caddy exited before serving")
		default:
		}
		if resp, err := client.Get(c.AdminURL + "/config/"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if conn, err := net.DialTimeout("tcp", site, time.Second); err == nil {
				conn.Close()
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("caddy not serving within %v", startTimeout)
}

// LogTail returns the end of the process's output.
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

// QueueStats is the part of a queue's entry in the admin API (GET
// /fair_queue/) that the tests read.
type QueueStats struct {
	Name  string `json:"name"`
	Stats struct {
		Waiting  int `json:"waiting"`
		InFlight int `json:"in_flight"`
	} `json:"stats"`
}

// Queue returns this instance's view of queue name, from the admin API.
func (c *Caddy) Queue(name string) (QueueStats, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get(c.AdminURL + "/fair_queue/")
	if err != nil {
		return QueueStats{}, err
	}
	defer resp.Body.Close()
	var list struct {
		Queues []QueueStats `json:"queues"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return QueueStats{}, fmt.Errorf("decode /fair_queue/: %w", err)
	}
	for _, q := range list.Queues {
		if q.Name == name {
			return q, nil
		}
	}
	return QueueStats{}, fmt.Errorf("queue %q not in /fair_queue/", name)
}

// WaitQueue polls the admin API until queue name has waiting waiters and
// inFlight permits held, and fails the test if it does not within d.
func (c *Caddy) WaitQueue(t testing.TB, name string, waiting, inFlight int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last QueueStats
	var err error
	for time.Now().Before(deadline) {
		last, err = c.Queue(name)
		if err == nil && last.Stats.Waiting == waiting && last.Stats.InFlight == inFlight {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("queue %s: want %d waiting and %d in flight within %v; last seen %+v (%v)",
		name, waiting, inFlight, d, last.Stats, err)
}

// Stream is a streaming chat completion that a test started to take a
// place in a queue: it holds a permit, or waits for one, until Release.
type Stream struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// StartStream sends a streaming chat completion to url (the whole
// /v1/chat/completions URL) whose answer lasts about 10 minutes, reads
// it in the background, and returns at once. Release ends it.
func StartStream(t testing.TB, url string) *Stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url,
		strings.NewReader(`{"model":"mock","stream":true,"messages":[{"role":"user","content":"hold"}]}`))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(mockllm.HeaderTokens, "6000")
	req.Header.Set(mockllm.HeaderDelay, "100ms")
	s := &Stream{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return // released, or Caddy is gone
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	t.Cleanup(s.Release)
	return s
}

// Release ends the stream, which gives back its permit or leaves the
// queue, and waits until the request has returned.
func (s *Stream) Release() {
	s.cancel()
	<-s.done
}
