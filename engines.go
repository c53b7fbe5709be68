package caddyfairqueue

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// maxQueuesPerHandler bounds how many queues one handler opens when its
// name comes from the request (a placeholder): each queue is a node in
// Redis with its own subscription, and the name may be client input.
const maxQueuesPerHandler = 100

// maxQueueNameLen bounds a queue name resolved from the request.
const maxQueueNameLen = 200

// queueIdle is how long a queue named from the request (a placeholder)
// may go without a request in it, in this handler, before the handler
// gives its reference back (the queue then leaves the store when no other
// handler holds it): a name a client made up, used once, holds no slot
// and no store keys for longer. A variable for tests.
var queueIdle = 10 * time.Second

// idleDropping runs between an idle queue's removal from its handler and
// the release of the handler's reference to it; tests use it to send a
// request in between.
var idleDropping = func(engineKey) {}

// engines holds one engine per engineKey in this process, shared by
// every handler (of every config generation) that names it, so that a
// config reload keeps waiting tickets in place and permits leased.
var engines = caddy.NewUsagePool()

// engineKey identifies an engine of the registry (engines): the store
// configuration (backend.storeID) and the queue name.
type engineKey struct {
	store string
	queue string
}

func newEngineKey(b backend, queue string) engineKey {
	return engineKey{store: b.storeID(), queue: queue}
}

// exiting reports whether the process is exiting, or a test says so
// (exitingForTest).
func exiting() bool { return exitingForTest.Load() || caddy.Exiting() }

// exitingForTest makes exiting report true. Caddy in a test process
// never exits; a flag rather than a swapped function, so that a test may
// set it while Caddy's goroutines read it.
var exitingForTest atomic.Bool

// provisions numbers handlers in the order they are provisioned, so that
// an engine takes the settings of the newest config that uses it and an
// old handler still serving during a reload cannot revert them.
var provisions atomic.Uint64

// engine is a value of the registry (engines): a fairqueue.Queue and the store client it
// uses. It outlives the handlers that reference it until its last
// in-flight request is done (a reload cleans up old handlers while their
// requests still run), except when the process exits.
type engine struct {
	name     string
	store    storeDesc // where the queue lives, for the admin API
	q        *fairqueue.Queue
	release  func() // frees what the backend opened (a Redis client, a local store)
	log      *zap.Logger
	fallback *memstore.Store // this node's queue while the store is down (on_store_error local)
	data     string          // the backend's dataID: engines of one name and data are one queue
	gauges   *gaugeWatch     // reads the backend's gauges (adaptive backend_metrics); nil: none
	running  atomic.Int64    // requests granted and not yet finished (see reserved)
	waits    waitList        // requests waiting in its queue (see retiredSum)
	tokens   atomic.Int64    // their KV-cache tokens (fairqueue.Request.Tokens; see reservedTokens)
	grants   atomic.Int64    // permits its queue granted to this instance's requests (engineObserver)
	kv       promptEstimator // the prompt's bytes per token, learned from answers
	budget   budgetEstimator // the completion budget of a request that sets none, learned from answers
	routes   engineRoutes    // the live handlers' routes, by the shape of their grants
	appliers appliers        // the handlers that applied their settings, while they hold it (appliers.go)
	// loads counts, by config load, the live handlers that hold a
	// reference to the engine (namesakes.use); under namesakes.mu.
	loads map[<-chan struct{}]int
	// apart are the namesakes in other stores that a config load used
	// beside it (two sites, apart by the operator's choice); under
	// namesakes.mu (namesakes_apart.go).
	apart map[*engine]bool

	// remote: releasing a permit is a store round trip (Redis), so
	// finish runs it in the background.
	remote   bool
	releases sync.WaitGroup // background releases in progress

	mu     sync.Mutex
	active int // requests between enter and exit
	// graces counts the requests between enter and exit by the abort
	// grace of the handler that serves them (endRunning waits the
	// longest).
	graces  map[time.Duration]int
	retired bool // the registry dropped its last reference
	// retiredFlag is retired, read without mu (reserved).
	retiredFlag atomic.Bool
	// moved: the queue's waiters moved to a namesake in another store,
	// and its new ones go there (namesakes.go).
	moved atomic.Bool
	// borrows counts the requests of handlers cleaned up by a reload
	// that use it (Handler.use): the exit answers their waiters (exit.go).
	borrows atomic.Int32
	closed  bool // q.Close was called
	// closeDone is closed when the close that set closed is done.
	closeDone chan struct{}
	gen       uint64 // provisioning number of the settings in force (0: opened at a provision, none applied yet)
	// settingsGen is the provisioning number of the handler whose
	// settings the queue has, in force or kept until the next handler
	// applies its own (gen is 0 then): grants are made under them.
	settingsGen uint64
}

// newEngine opens queue name in b with h's settings, in force as those
// of provisioning number gen (see engine.gen).
func newEngine(b backend, name string, h *Handler, gen uint64) (*engine, error) {
	st, release, err := b.open(name)
	if err != nil {
		return nil, err
	}
	// Each engine (node) has its own fallback: the local queue of one
	// instance is not shared.
	fallback := memstore.New()
	e := &engine{name: name, data: b.dataID(), store: b.describe(), release: release, log: h.logger, fallback: fallback, gen: gen,
		settingsGen: h.gen, remote: b.dataID() != localID}
	cfg := e.observed(h.queueConfig(name, fallback))
	cfg.Reserved, cfg.ReservedTokens = e.reserved, e.reservedTokens
	if e.q, err = fairqueue.New(st, cfg); err != nil {
		release()
		return nil, err
	}
	if a := cfg.Adaptive; a != nil && a.BackendMetrics != "" {
		e.gauges = watchGauges(e)
	}
	namesakes.add(e)
	return e, nil
}

// finish ends a request that entered the engine: it releases the
// request's permit, if it got one, then calls done (the request's exit).
// A release that is a store round trip runs in the background: HTTP/1.1
// reads a connection's next request only once the handler has returned,
// so a release in the handler would delay the client's next request by
// that round trip. The upstream has answered by then; the permit only
// has to reach the next waiter, which it does as fast either way.
//
// When the release wakes a waiter of this node at once (the local
// store, or a local handoff), the request then yields its thread: the
// woken waiter (or the release's goroutine, which wakes it) is this
// thread's next goroutine, but would run only once this request has also
// finished its answer and parked reading the connection's next request;
// on a busy machine that put tens of microseconds, most of the handoff's
// own time, between the release and the next request's start. What this
// request has left to do waits for the upstream's next request instead:
// the permit is the bottleneck, not this request's end. Nobody woken,
// nothing yields: a yield wakes an idle thread, which costs CPU at low
// load.
func (e *engine) finish(p *fairqueue.Permit, done func()) {
	if p == nil {
		done()
		return
	}
	// A closed engine's queue is leaving the store, which releases every
	// permit of the node: nothing goes in the background then, so close's
	// wait sees every Add.
	e.mu.Lock()
	background := e.remote && !p.Local() && !e.closed
	if background {
		e.releases.Add(1)
	}
	e.mu.Unlock()
	if !background {
		woken := e.q.Woken()
		p.Release()
		if e.q.Woken() != woken {
			runtime.Gosched()
		}
		done()
		return
	}
	handsOn := e.q.HeadIsOwn()
	go func() {
		p.Release()
		e.releases.Done() // before done: done may close the engine, which waits for releases
		done()
	}()
	if handsOn {
		runtime.Gosched()
	}
}

// enter counts a request that uses the engine, served by a handler
// whose abort grace is grace; exit, with the same grace, must follow.
func (e *engine) enter(grace time.Duration) {
	e.mu.Lock()
	e.active++
	if e.graces == nil {
		e.graces = make(map[time.Duration]int)
	}
	e.graces[grace]++
	e.mu.Unlock()
}

// exit ends a request; the last one out of a retired engine closes it.
func (e *engine) exit(grace time.Duration) {
	e.mu.Lock()
	e.active--
	if e.graces[grace]--; e.graces[grace] <= 0 {
		delete(e.graces, grace)
	}
	last := e.active == 0 && e.retired
	e.mu.Unlock()
	if last {
		if err := e.close(); err != nil {
			e.log.Warn("closing retired queue", zap.String("queue", e.name), zap.Error(err))
		}
	}
}

// Destruct implements caddy.Destructor: the registry dropped its last
// reference. On exit the queue closes at once (the grace period is over:
// this node's remaining permits are released in the store); on a reload
// it closes when its last request is done, or when the process exits
// (exit.go).
func (e *engine) Destruct() error {
	e.mu.Lock()
	e.retired = true
	e.retiredFlag.Store(true)
	now := e.active == 0 || exiting()
	e.mu.Unlock()
	if s := namesakes.successor(e); s != nil && s.routes.known() {
		e.move()
	}
	if s := namesakes.liveSameStore(e); s != nil {
		e.adopt(s) // its releases hand permits on in s's queue
	}
	if now {
		if exiting() {
			e.endRunning()
		}
		return e.close()
	}
	watchExit()
	return nil
}

// adopt gives e, retired, the settings of s, a live queue of its data
// (see sameStore); e keeps its own fallback queue.
func (e *engine) adopt(s *engine) {
	s.mu.Lock()
	gen, of := s.gen, s.settingsGen
	cfg := s.q.Config()
	s.mu.Unlock()
	if cfg.Fallback != nil {
		cfg.Fallback = e.fallback
	}
	if _, _, err := e.reconfigureAs(gen, of, cfg); err != nil {
		e.log.Warn("applying queue settings to the retired queue", zap.String("queue", e.name), zap.Error(err))
	}
}

// close leaves the queue; it is bounded by the engine's store timeout.
// A second call waits for the first one's leave: the exit's (Destruct)
// must not return while the last request's is under way.
func (e *engine) close() error {
	e.mu.Lock()
	if e.closed {
		done := e.closeDone
		e.mu.Unlock()
		<-done
		return nil
	}
	e.closed = true
	e.closeDone = make(chan struct{})
	defer close(e.closeDone)
	gauges := e.gauges
	e.mu.Unlock()
	if namesakes.remove(e) {
		// Its metric series go with the last engine of the name.
		forgetQueue(e.name)
	}
	// Let background releases finish (each is bounded by the store
	// timeout) rather than fail on a closed client.
	e.releases.Wait()
	gauges.stop()
	err := e.q.Close()
	e.release()
	return err
}

// settingsOf is the provisioning number of the handler whose settings
// the queue has (settingsGen).
func (e *engine) settingsOf() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.settingsGen
}

// reconfigure applies cfg unless a newer config's settings are in force.
func (e *engine) reconfigure(gen uint64, cfg fairqueue.Config) (old fairqueue.Config, changed bool, err error) {
	return e.reconfigureAs(gen, gen, cfg)
}

// reconfigureAs is reconfigure of the settings of the handler numbered
// of, in force as those of gen (adopt: another queue's, in force or
// kept there).
func (e *engine) reconfigureAs(gen, of uint64, cfg fairqueue.Config) (old fairqueue.Config, changed bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if gen < e.gen {
		return fairqueue.Config{}, false, nil
	}
	old = e.q.Config()
	cfg = e.observed(cfg)
	cfg.Reserved, cfg.ReservedTokens = e.reserved, e.reservedTokens
	if err := e.q.Reconfigure(cfg); err != nil {
		return old, false, err
	}
	e.gen, e.settingsGen = gen, of
	if a := cfg.Adaptive; a != nil && a.BackendMetrics != "" && e.gauges == nil && !e.closed {
		e.gauges = watchGauges(e) // a reload asked for the backend's gauges
	}
	return old, true, nil
}

// openEngines lists the engines open in this process, oldest first, for
// the admin API and the gauges: those the configs in force use, and
// those a reload retired whose requests still run (namesakes lists both
// until they close).
func openEngines() []*engine { return namesakes.all() }

// byQueue groups engines by key and data set: engines of one queue on
// the same data (two Redis clients of one Redis, a retired engine and
// the live one) are one queue, reported once. Groups and the engines in
// each keep the order of es.
func byQueue(es []*engine, key func(*engine) string) [][]*engine {
	type k struct{ key, data string }
	at := make(map[k]int)
	var out [][]*engine
	for _, e := range es {
		kk := k{key(e), e.data}
		i, ok := at[kk]
		if !ok {
			i = len(out)
			at[kk] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], e)
	}
	return out
}

// storeDesc is where a queue lives, without credentials, as the admin
// API reports it (queueReport).
type storeDesc struct {
	Store     string `json:"store"`             // "redis" or "local"
	Mode      string `json:"mode,omitempty"`    // redis: standalone, sentinel or cluster
	Address   string `json:"address,omitempty"` // redis: host:port, unix:/path, or the Sentinels or cluster seeds; never credentials
	Master    string `json:"master,omitempty"`  // redis sentinel: the master's name
	DB        int    `json:"db,omitempty"`
	KeyPrefix string `json:"key_prefix,omitempty"`
}
