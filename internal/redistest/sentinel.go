package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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

// Sentinel deployment of StartSentinel.
const (
	// SentinelMasterName is the name the Sentinels monitor the master by.
	SentinelMasterName = "fq-master"
	// sentinels is the number of Sentinel processes; sentinelQuorum of
	// them must agree that the master is down, and a majority must elect
	// the leader that fails over.
	sentinels      = 3
	sentinelQuorum = 2
	// SentinelDownAfter is how long the master must be unreachable before
	// a Sentinel considers it down (down-after-milliseconds).
	SentinelDownAfter = time.Second
	// SentinelFailoverTimeout is the Sentinels' failover-timeout: how
	// long a failover may take before another is tried.
	SentinelFailoverTimeout = 3 * time.Second
	// sentinelReadyTimeout bounds the wait for the Sentinels to find the
	// replica and each other (they announce themselves every 2s).
	sentinelReadyTimeout = 30 * time.Second
	// failoverTimeout bounds KillMaster's wait for the new master:
	// detection (1s), agreement, election and promotion take 2-6s.
	failoverTimeout = 30 * time.Second
)

// Sentinel is a master, one replica and three Redis Sentinels (quorum 2,
// down-after-milliseconds 1000, failover-timeout 3000) monitoring them
// under SentinelMasterName, all owned by a test. The data servers are
// Servers (no persistence); the Sentinels are redis-server --sentinel
// processes, since Debian's redis-server package has no redis-sentinel
// binary.
type Sentinel struct {
	tb        testing.TB
	servers   []*Server // master and replica as started; roles change on failover
	sentinels []*sentinelProc
}

// StartSentinel starts the deployment and waits until every Sentinel
// knows the master, its replica and the other Sentinels, and confirms
// that it can reach the quorum (SENTINEL CKQUORUM). Options apply to
// both data servers. Everything is stopped when tb ends.
func StartSentinel(tb testing.TB, opts ...Option) *Sentinel {
	tb.Helper()
	// Either server may be the master: neither delays a full sync to
	// wait for more replicas (5s by default).
	opts = append([]Option{WithArgs("--repl-diskless-sync-delay", "0")}, opts...)
	master := Start(tb, opts...)
	replica := Start(tb, append(slices.Clone(opts), WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(master.Port())))...)
	s := &Sentinel{tb: tb, servers: []*Server{master, replica}}

	ctx, cancel := context.WithTimeout(context.Background(), sentinelReadyTimeout)
	defer cancel()
	if err := waitReplicaLinked(ctx, replica); err != nil {
		tb.Fatalf("redistest: replica %s of %s: %v\n%s", replica.Addr(), master.Addr(), err, replica.logTail())
	}
	s.sentinels = startSentinelProcs(tb, master.Port(), replica.Port())
	if err := s.waitReady(ctx); err != nil {
		tb.Fatalf("redistest: sentinels not ready: %v\n%s", err, s.logTails())
	}
	return s
}

// SentinelAddrs returns the host:port of every Sentinel.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, p := range s.sentinels {
		addrs[i] = p.addr()
	}
	return addrs
}

// MasterName returns the name the Sentinels monitor the master by.
func (s *Sentinel) MasterName() string { return SentinelMasterName }

// Servers returns the data servers: the master and the replica as
// started (after a failover the replica is the master).
func (s *Sentinel) Servers() []*Server { return slices.Clone(s.servers) }

// MasterAddr returns the master's host:port as the first Sentinel that
// answers reports it.
func (s *Sentinel) MasterAddr() string {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var lastErr error
	for _, p := range s.sentinels {
		addr, err := p.masterAddr(ctx)
		if err == nil {
			return addr
		}
		lastErr = err
	}
	s.tb.Fatalf("redistest: no Sentinel names the master: %v", lastErr)
	return ""
}

// FailoverClient returns a go-redis client of the master found through
// the Sentinels, closed when tb ends. Each opt may change the options
// before the client is made.
func (s *Sentinel) FailoverClient(tb testing.TB, opts ...func(*redis.FailoverOptions)) *redis.Client {
	tb.Helper()
	o := &redis.FailoverOptions{MasterName: SentinelMasterName, SentinelAddrs: s.SentinelAddrs()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewFailoverClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// KillMaster kills the current master with SIGKILL, as a crash would,
// and waits until every Sentinel names the promoted replica as the
// master and that replica answers as one. It returns the new master's
// address. Writes the replica had not received yet are lost, as in any
// real failover. The old master stays down.
func (s *Sentinel) KillMaster() string {
	s.tb.Helper()
	old := s.MasterAddr()
	srv := s.server(old)
	if srv == nil {
		s.tb.Fatalf("redistest: the master %s is none of this deployment's servers", old)
	}
	srv.Kill()

	ctx, cancel := context.WithTimeout(context.Background(), failoverTimeout)
	defer cancel()
	var lastErr error
	for {
		addr, err := s.agreedMaster(ctx)
		if err == nil && addr != old {
			if err = isMaster(ctx, addr); err == nil {
				return addr
			}
		}
		if err == nil {
			err = fmt.Errorf("the Sentinels still name %s", old)
		}
		lastErr = err
		select {
		case <-ctx.Done():
			s.tb.Fatalf("redistest: no failover from %s within %v: %v\n%s", old, failoverTimeout, lastErr, s.logTails())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// agreedMaster returns the master address every Sentinel names, or an
// error while they disagree.
func (s *Sentinel) agreedMaster(ctx context.Context) (string, error) {
	var addr string
	for i, p := range s.sentinels {
		a, err := p.masterAddr(ctx)
		if err != nil {
			return "", err
		}
		if i > 0 && a != addr {
			return "", fmt.Errorf("sentinel %s names %s, sentinel %s names %s", s.sentinels[0].addr(), addr, p.addr(), a)
		}
		addr = a
	}
	return addr, nil
}

func (s *Sentinel) server(addr string) *Server {
	for _, srv := range s.servers {
		if srv.Addr() == addr {
			return srv
		}
	}
	return nil
}

// waitReady polls until every Sentinel sees the master with its replica
// and the other Sentinels, and reports that it can reach the quorum and
// authorize a failover.
func (s *Sentinel) waitReady(ctx context.Context) error {
	var lastErr error
	for {
		lastErr = s.ready(ctx)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Sentinel) ready(ctx context.Context) error {
	for _, p := range s.sentinels {
		m, err := p.client.Master(ctx, SentinelMasterName).Result()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", p.addr(), err)
		}
		if m["num-slaves"] != "1" || m["num-other-sentinels"] != strconv.Itoa(sentinels-1) {
			return fmt.Errorf("sentinel %s knows %s replicas and %s other sentinels", p.addr(), m["num-slaves"], m["num-other-sentinels"])
		}
		if err := p.client.CkQuorum(ctx, SentinelMasterName).Err(); err != nil {
			return fmt.Errorf("sentinel %s: %w", p.addr(), err)
		}
	}
	return nil
}

func (s *Sentinel) logTails() string {
	var b strings.Builder
	for _, p := range s.sentinels {
		b.WriteString(p.logTail())
	}
	return b.String()
}

// waitReplicaLinked waits until the replica has synchronised with its
// master.
func waitReplicaLinked(ctx context.Context, replica *Server) error {
	c := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not linked to its master: %w (info: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// isMaster reports, as an error, whether the server at addr does not
// (yet) answer as a master.
func isMaster(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "role:master") {
		return fmt.Errorf("%s is not a master yet", addr)
	}
	return nil
}

// sentinelProc is one redis-server --sentinel process. Sentinel rewrites
// its config file, so each has its own in its own directory.
type sentinelProc struct {
	port    int
	id      string // sentinel myid
	dir     string
	logPath string
	client  *redis.SentinelClient

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// startSentinelProcs starts the Sentinels monitoring the master on
// 127.0.0.1:masterPort, and waits until each answers PING. Each config
// names the replica and the other Sentinels, so that they need not wait
// for each other's announcements (every 2s) before they can fail over.
func startSentinelProcs(tb testing.TB, masterPort, replicaPort int) []*sentinelProc {
	tb.Helper()
	bin, err := exec.LookPath(Binary)
	if err != nil {
		tb.Fatalf("redistest: %s not found in PATH (%v): run scripts/ensure-redis.sh to install it", Binary, err)
	}
	procs := make([]*sentinelProc, sentinels)
	for i := range procs {
		p := &sentinelProc{dir: tb.TempDir()}
		p.logPath = filepath.Join(p.dir, "sentinel.log")
		tb.Cleanup(p.kill)
		procs[i] = p
	}
	var lastErr error
	for range bindAttempts {
		for _, p := range procs {
			if p.port, err = freePort(); err != nil {
				tb.Fatalf("redistest: find a free port: %v", err)
			}
			p.id = newRunID()
		}
		lastErr = nil
		for _, p := range procs {
			if lastErr = p.start(bin, masterPort, replicaPort, procs); lastErr != nil {
				break
			}
		}
		if lastErr == nil {
			for _, p := range procs {
				p.client = redis.NewSentinelClient(&redis.Options{Addr: p.addr(), DialTimeout: time.Second,
					ReadTimeout: time.Second, MaxRetries: -1})
				tb.Cleanup(func() { _ = p.client.Close() })
			}
			return procs
		}
		for _, p := range procs {
			p.kill()
		}
		if !errors.Is(lastErr, errPortInUse) {
			break
		}
	}
	var tails strings.Builder
	for _, p := range procs {
		tails.WriteString(p.logTail())
	}
	tb.Fatalf("redistest: start sentinels: %v\n%s", lastErr, tails.String())
	return nil
}

// newRunID returns a random Sentinel ID: 40 hex digits.
func newRunID() string {
	var b [20]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (p *sentinelProc) addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
}

func (p *sentinelProc) start(bin string, masterPort, replicaPort int, all []*sentinelProc) error {
	conf := filepath.Join(p.dir, "sentinel.conf")
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	lines := []string{
		"port " + strconv.Itoa(p.port),
		"bind 127.0.0.1",
		"dir " + p.dir,
		"logfile \"\"",
		"sentinel myid " + p.id,
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d", SentinelMasterName, masterPort, sentinelQuorum),
		fmt.Sprintf("sentinel down-after-milliseconds %s %s", SentinelMasterName, ms(SentinelDownAfter)),
		fmt.Sprintf("sentinel failover-timeout %s %s", SentinelMasterName, ms(SentinelFailoverTimeout)),
		fmt.Sprintf("sentinel parallel-syncs %s 1", SentinelMasterName),
		fmt.Sprintf("sentinel known-replica %s 127.0.0.1 %d", SentinelMasterName, replicaPort),
	}
	for _, o := range all {
		if o != p {
			lines = append(lines, fmt.Sprintf("sentinel known-sentinel %s 127.0.0.1 %d %s", SentinelMasterName, o.port, o.id))
		}
	}
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	logFile, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	logFile.Close()
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()

	c := redis.NewClient(&redis.Options{Addr: p.addr(), DialTimeout: 250 * time.Millisecond, ReadTimeout: 250 * time.Millisecond, MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	deadline := time.Now().Add(defaultStartTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			if b, _ := os.ReadFile(p.logPath); strings.Contains(string(b), "Address already in use") {
				return fmt.Errorf("port %d: %w", p.port, errPortInUse)
			}
			return errors.New("exited before answering PING")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil && strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n") {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("no answer to PING within %v", defaultStartTimeout)
}

// masterAddr asks this Sentinel for the master's address.
func (p *sentinelProc) masterAddr(ctx context.Context) (string, error) {
	hp, err := p.client.GetMasterAddrByName(ctx, SentinelMasterName).Result()
	if err != nil {
		return "", fmt.Errorf("sentinel %s: %w", p.addr(), err)
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("sentinel %s: unexpected master address %v", p.addr(), hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// kill sends SIGKILL to the Sentinel's process group and waits for it.
func (p *sentinelProc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	p.cmd = nil
}

func (p *sentinelProc) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no sentinel log: %v)\n", err)
	}
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
	}
	return "--- " + p.logPath + " (tail)\n" + string(b)
}
