package caddyfairqueue

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Go's HTTP/1 server notices that a client has closed its connection by
// a read in the background, once the request's body is read; but a byte
// that arrives there (the start of a next, pipelined request) ends that
// read, and the server then watches the connection no more. A client
// that sends a request, a byte more and closes its connection would so
// wait in the queue until max_wait, unseen, and be forwarded to the
// upstream when granted, for nobody; and a running request's would run
// on upstream to its end. The handler watches such a connection itself
// while its request waits and while it runs (a requeued request's wait
// again included): it looks at the socket,
// without reading from it, for the client's end of the connection
// (hungUp, Linux; elsewhere the server's read alone).

// hangupEvery is how often a waiting or running HTTP/1 request's
// connection is looked at for its client's close, while few are: the
// looks of every watch together are at most hangupLooksPerSecond (one
// poll each), so with many waiting each watch looks less often (50,000
// waiting: every 25 s), and the watches cost the instance about the
// same CPU however many wait. Go's server sees most clients leave at
// once; these looks are for the few it stopped watching. One goroutine
// looks (hangup_sweep.go): a request costs its watch no timer.
const (
	hangupEvery          = 500 * time.Millisecond
	hangupLooksPerSecond = 2000
)

// connCtxKey holds the request's connection in its context, as
// registerConnContext puts it there.
type connCtxKey struct{}

// registerConnContext has the server of the handler being provisioned
// (in ctx) keep each connection in its requests' context, for hungUp.
func registerConnContext(ctx caddy.Context) {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil {
		return
	}
	srv.RegisterConnContext(func(ctx context.Context, c net.Conn) context.Context {
		if ctx.Value(connCtxKey{}) != nil { // another handler of the server put it there
			return ctx
		}
		return context.WithValue(ctx, connCtxKey{}, c)
	})
}

// rawConnOf is the socket beneath r's HTTP/1 connection, through TLS
// and the listener wrappers that show what they wrap (proxy_protocol,
// Caddy's own: embeddedConn); nil where there is
// none (HTTP/2 and HTTP/3 streams, whose resets the server sees).
func rawConnOf(r *http.Request) syscall.RawConn {
	if r.ProtoMajor != 1 {
		return nil
	}
	c, _ := r.Context().Value(connCtxKey{}).(net.Conn)
	for range 8 { // wrappers around wrappers, up to a bound
		switch v := c.(type) {
		case nil:
			return nil
		case syscall.Conn:
			if rc, err := v.SyscallConn(); err == nil {
				return rc
			}
			return nil
		case *tls.Conn:
			c = v.NetConn()
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		case interface{ Raw() net.Conn }: // proxy_protocol's
			c = v.Raw()
		default:
			c = embeddedConn(v)
		}
	}
	return nil
}

// connType is net.Conn's type.
var connType = reflect.TypeFor[net.Conn]()

// embeddedConn is the net.Conn that c embeds, as Caddy's own wrappers
// do (its http2 listener's, its http_redirect's): a struct, or a
// pointer to one, whose exported field Conn is a net.Conn; else nil.
func embeddedConn(c net.Conn) net.Conn {
	v := reflect.ValueOf(c)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	f := v.FieldByName("Conn")
	if !f.IsValid() || f.Type() != connType || !f.CanInterface() {
		return nil
	}
	inner, _ := f.Interface().(net.Conn)
	return inner
}

// hangupWatch calls its cancel when the client of an HTTP/1 request
// is seen to have closed its connection.
type hangupWatch struct {
	rc     syscall.RawConn
	cancel context.CancelFunc
	own    bool       // cancel is the watch's own context's: stop calls it
	mu     sync.Mutex // a look and stop hold it
	gone   atomic.Bool
	halted atomic.Bool
	at     int // its place in hangups.ws; under hangups.mu
}

// watchHangup watches r's connection while r waits, until stop: a
// context that ends when the client's end of the connection is seen
// closed. A request without a socket to watch gets ctx and a nil watch.
func watchHangup(ctx context.Context, r *http.Request) (context.Context, *hangupWatch) {
	rc := rawConnOf(r)
	if rc == nil || !canSeeHangup {
		return ctx, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	return ctx, startHangupWatch(rc, cancel, true)
}

// watchRunning watches r's connection while next runs it, until stop:
// cut, which ends r's context (cancelable), is called when the client's
// end of the connection is seen closed. Nil: nothing to watch.
func watchRunning(r *http.Request, cut context.CancelFunc) *hangupWatch {
	rc := rawConnOf(r)
	if rc == nil || !canSeeHangup || cut == nil {
		return nil
	}
	return startHangupWatch(rc, cut, false)
}

// hangupWatchable reports whether r's connection can be watched (an
// HTTP/1 request with a socket beneath, on Linux).
func hangupWatchable(r *http.Request) bool { return canSeeHangup && rawConnOf(r) != nil }

func startHangupWatch(rc syscall.RawConn, cancel context.CancelFunc, own bool) *hangupWatch {
	w := &hangupWatch{rc: rc, cancel: cancel, own: own}
	hangups.add(w)
	return w
}

// look looks at w's connection once (hangups' goroutine).
func (w *hangupWatch) look() {
	// Under mu, as stop halts the watch: once stop has returned, no look
	// cancels (a hijack stops the watch of a running request before its
	// client can half-close the tunnel).
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.halted.Load() {
		return
	}
	if hungUp(w.rc) {
		w.gone.Store(true)
		w.cancel()
	}
}

// stop ends the watch; it reports whether the client was seen gone, or,
// for a waiting request's watch (watchHangup: it is about to be
// forwarded), is now.
func (w *hangupWatch) stop() (gone bool) {
	if w == nil {
		return false
	}
	w.mu.Lock()
	halting := w.halted.CompareAndSwap(false, true)
	w.mu.Unlock()
	if halting {
		hangups.remove(w)
	}
	if !w.own {
		return w.gone.Load()
	}
	w.cancel()
	return w.gone.Load() || hungUp(w.rc)
}
