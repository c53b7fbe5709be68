// Package redistest starts real redis-server processes for tests.
//
// Each Server runs in its own temporary directory on a free loopback port,
// persists nothing by default and is stopped when the test ends. Tests can
// kill, restart, freeze and thaw it to exercise store failures. Methods
// that fail the test (everything but Addr and Port) must be called from
// the goroutine running the test that started the Server.
//
// The redis-server binary is taken from PATH; scripts/ensure-redis.sh
// installs it. A missing binary fails the test rather than skipping it,
// so that a machine without Redis cannot pass the suite by testing nothing.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Binary is the name of the Redis server executable looked up in PATH.
const Binary = "redis-server"

const (
	defaultStartTimeout = 15 * time.Second
	stopTimeout         = 10 * time.Second
	// bindAttempts bounds the retries when the free port found for a new
	// Server is taken by someone else before redis-server binds it.
	bindAttempts = 5
	logTailBytes = 4 << 10
)

// defaultArgs make a Server a pure in-memory store. Arguments given with
// WithArgs come after them, so they win.
var defaultArgs = []string{
	"--save", "",
	"--appendonly", "no",
	"--bind", "127.0.0.1",
	"--loglevel", "notice",
	"--logfile", "", // stdout, which goes to the log file in the Server's dir
}

// Option configures a Server started by Start.
type Option func(*config)

type config struct {
	args         []string
	startTimeout time.Duration
}

// WithArgs appends command-line arguments to redis-server, after the
// defaults (--save "" --appendonly no --bind 127.0.0.1), which they
// therefore override: WithArgs("--appendonly", "yes") enables the AOF.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// WithStartTimeout sets how long Start and Restart wait for the server to
// answer PING. The default is 15s.
func WithStartTimeout(d time.Duration) Option {
	return func(c *config) { c.startTimeout = d }
}

// Server is a redis-server process owned by a test.
type Server struct {
	tb      testing.TB
	bin     string
	dir     string
	logPath string
	cfg     config
	port    int

	mu     sync.Mutex
	proc   *process // nil when not running
	frozen bool
}

// process is one run of redis-server. done is closed once Wait returned.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the result of Wait, readable after done is closed
}

// Start starts a redis-server on a free loopback port, waits until it
// answers PING and registers its shutdown with tb.Cleanup. It fails the
// test if redis-server is not in PATH or does not come up.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	bin, err := exec.LookPath(Binary)
	if err != nil {
		tb.Fatalf("redistest: %s not found in PATH (%v): run scripts/ensure-redis.sh to install it", Binary, err)
	}
	cfg := config{startTimeout: defaultStartTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	// TempDir first: cleanups run last-in first-out, so the process is
	// gone before its directory is removed.
	dir := tb.TempDir()
	s := &Server{
		tb:      tb,
		bin:     bin,
		dir:     dir,
		logPath: filepath.Join(dir, "redis.log"),
		cfg:     cfg,
	}
	tb.Cleanup(s.kill)

	var lastErr error
	for range bindAttempts {
		port, err := freePort()
		if err != nil {
			tb.Fatalf("redistest: find a free port: %v", err)
		}
		s.port = port
		err = s.start()
		if err == nil {
			return s
		}
		lastErr = err
		if !errors.Is(err, errPortInUse) {
			break
		}
	}
	tb.Fatalf("redistest: start %s: %v\n%s", Binary, lastErr, s.logTail())
	return nil
}

// Addr returns the host:port the server listens on.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Port returns the TCP port the server listens on. It does not change
// across Restart.
func (s *Server) Port() int { return s.port }

// Client returns a go-redis client of the server, closed when tb ends.
// Each opt may change the options before the client is made.
func (s *Server) Client(tb testing.TB, opts ...func(*redis.Options)) *redis.Client {
	tb.Helper()
	o := &redis.Options{Addr: s.Addr()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Keys returns the keys matching pattern, sorted, found with SCAN (not
// KEYS) so that it behaves like production code would. Tests use it to
// assert that nothing leaked.
func (s *Server) Keys(tb testing.TB, pattern string) []string {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var keys []string
	var cursor uint64
	for {
		page, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			tb.Fatalf("redistest: scan %q on %s: %v", pattern, s.Addr(), err)
		}
		keys = append(keys, page...)
		cursor = next
		if cursor == 0 {
			break
		}
	}
	// SCAN may return a key more than once.
	slices.Sort(keys)
	return slices.Compact(keys)
}

// Kill sends SIGKILL to the server and waits for it to exit, as a crash
// would. Killing a server that is not running does nothing.
func (s *Server) Kill() {
	s.tb.Helper()
	s.kill()
}

// Stop shuts the server down gracefully (SIGTERM) and waits for it to
// exit, killing it if it takes longer than 10s. Stopping a server that is
// not running does nothing.
func (s *Server) Stop() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return
	}
	if s.frozen {
		// A stopped process keeps SIGTERM pending until it continues.
		s.signal(syscall.SIGCONT)
		s.frozen = false
	}
	s.signal(syscall.SIGTERM)
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		s.proc = nil
	case <-timer.C:
		s.signal(syscall.SIGKILL)
		<-p.done
		s.proc = nil
		s.tb.Fatalf("redistest: %s on %s ignored SIGTERM for %v; killed\n%s", Binary, s.Addr(), stopTimeout, s.logTail())
	}
}

// Restart starts the server again on the same port, killing it first if
// it is still running, and waits until it answers PING. With the default
// arguments nothing was persisted, so the new server starts empty.
func (s *Server) Restart() {
	s.tb.Helper()
	s.kill()
	// The old process is gone, but another may have taken the port in the
	// meantime; clients know this address, so wait for it rather than move.
	var err error
	for range bindAttempts {
		if err = s.start(); !errors.Is(err, errPortInUse) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		s.tb.Fatalf("redistest: restart %s on %s: %v\n%s", Binary, s.Addr(), err, s.logTail())
	}
}

// Freeze suspends the server with SIGSTOP: it keeps its connections open
// but answers nothing, as a hung or partitioned server would, until Thaw.
func (s *Server) Freeze() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		s.tb.Fatalf("redistest: freeze %s: not running", s.Addr())
	}
	s.signal(syscall.SIGSTOP)
	s.frozen = true
}

// Thaw resumes a server suspended by Freeze with SIGCONT. It does nothing
// to a server that is not frozen.
func (s *Server) Thaw() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || !s.frozen {
		return
	}
	s.signal(syscall.SIGCONT)
	s.frozen = false
}

// errPortInUse reports that redis-server could not bind its port.
var errPortInUse = errors.New("port in use")

// start runs redis-server on s.port and waits until it answers PING. It
// returns errPortInUse, wrapped, when the port was taken.
func (s *Server) start() error {
	args := []string{"--port", strconv.Itoa(s.port), "--dir", s.dir}
	args = append(args, defaultArgs...)
	args = append(args, s.cfg.args...)

	logFile, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	// Only this run's output tells whether this run failed to bind.
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		logFile.Close()
		return fmt.Errorf("open log: %w", err)
	}
	fmt.Fprintf(logFile, "--- redistest: %s %s\n", s.bin, strings.Join(quote(args), " "))

	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	// The child has its own copy of the descriptor.
	logFile.Close()
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.frozen = false
	s.mu.Unlock()

	if err := s.waitReady(p); err != nil {
		s.kill()
		if s.logSince(logStart, "Address already in use") {
			return fmt.Errorf("port %d: %w", s.port, errPortInUse)
		}
		return err
	}
	return nil
}

// waitReady polls the server until it answers PING and proves, by its
// process ID, to be p rather than another server that took the port.
func (s *Server) waitReady(p *process) error {
	c := redis.NewClient(&redis.Options{
		Addr:        s.Addr(),
		DialTimeout: 250 * time.Millisecond,
		ReadTimeout: 250 * time.Millisecond,
		MaxRetries:  -1,
		PoolSize:    1,
	})
	defer c.Close()

	deadline := time.Now().Add(s.cfg.startTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("exited before answering PING: %v", p.err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		lastErr = s.ping(ctx, c, p.cmd.Process.Pid)
		cancel()
		if lastErr == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("no answer to PING within %v: %v", s.cfg.startTimeout, lastErr)
}

func (s *Server) ping(ctx context.Context, c *redis.Client, pid int) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return err
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	want := "process_id:" + strconv.Itoa(pid)
	for line := range strings.Lines(info) {
		if strings.TrimSpace(line) == want {
			return nil
		}
	}
	return fmt.Errorf("%s is served by another process", s.Addr())
}

// kill sends SIGKILL to the process group and waits for the process.
func (s *Server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return
	}
	s.signal(syscall.SIGKILL)
	<-p.done
	s.proc = nil
	s.frozen = false
}

// signal sends sig to the process group of the running server, so that a
// child forked for BGSAVE gets it too. s.mu must be held.
func (s *Server) signal(sig syscall.Signal) {
	select {
	case <-s.proc.done:
		// Reaped: its process group ID may belong to someone else now.
		return
	default:
	}
	// The group may still be gone already; Wait reports how it ended.
	_ = syscall.Kill(-s.proc.cmd.Process.Pid, sig)
}

// logTail returns the end of the server's log, for failure messages.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return "--- " + s.logPath + " (tail)\n" + string(b)
}

// logSince reports whether the log, from offset on, contains substr.
func (s *Server) logSince(offset int64, substr string) bool {
	b, err := os.ReadFile(s.logPath)
	if err != nil || int64(len(b)) < offset {
		return false
	}
	return bytes.Contains(b[offset:], []byte(substr))
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// quote makes empty arguments visible in the logged command line.
func quote(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return out
}
