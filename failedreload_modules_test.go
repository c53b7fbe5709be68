package caddyfairqueue

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/require"
)

// Modules for tests of config loads that fail: they fail at a moment the
// test chooses, while the config in force serves.

// stallProvision is a handler module for tests: its Provision waits
// until the test releases it, then fails, so that a config load that
// fails after the modules before it were provisioned is held at that
// moment while the config in force serves.
type stallProvision struct{}

// stall holds stallProvision: entered gets a value when a Provision
// starts, and a Provision returns (an error) once release is closed.
var stall struct {
	entered chan struct{}
	release chan struct{}
}

func init() { caddy.RegisterModule(stallProvision{}) }

// CaddyModule returns the Caddy module information.
func (stallProvision) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.fair_queue_test_stall",
		New: func() caddy.Module { return new(stallProvision) },
	}
}

// Provision waits for the test, then fails.
func (stallProvision) Provision(caddy.Context) error {
	stall.entered <- struct{}{}
	<-stall.release
	return errors.New("stalled, then failed (test)")
}

func (stallProvision) ServeHTTP(http.ResponseWriter, *http.Request, caddyhttp.Handler) error {
	return nil
}

// failStart is an app module for tests whose Start fails once the test
// releases it, after the http app of its config has started serving: a
// config load that fails to start (Caddy then stops the apps already
// started), held while its servers serve. The apps of a config start in
// no set order: if the http app has not started when Start runs (its
// server at Port does not answer), Start fails at once with
// errHTTPNotFirst, and the test loads the config again.
type failStart struct {
	// Port of a server of the config's http app.
	Port int `json:"port"`
}

// errHTTPNotFirst: failStart started before the http app.
var errHTTPNotFirst = errors.New("the http app had not started (test)")

// failing holds failStart: entered gets a value when a Start finds the
// http app serving, and that Start fails once release is closed.
var failing struct {
	entered chan struct{}
	release chan struct{}
}

func init() { caddy.RegisterModule(failStart{}) }

// failStartApp is the JSON of the failStart app (a config's "apps"
// member, with its trailing comma) for a server on port.
func failStartApp(port int) string {
	return fmt.Sprintf(`"fair_queue_test_failstart":{"port":%d},`, port)
}

// loadFailing loads cfg, a config with the failStart app, in the
// background, again until its http app has started before the failStart
// app, whose Start then waits for failing.release: the config serves
// until the test lets its load fail. It returns the load's outcome.
func loadFailing(t *testing.T, cfg string) <-chan error {
	t.Helper()
	loaded := make(chan error, 1)
	for try := 0; ; try++ {
		require.Less(t, try, 30, "the http app never started before the failing app")
		failing.entered = make(chan struct{}, 1)
		go func() { loaded <- caddy.Load([]byte(cfg), false) }()
		select {
		case <-failing.entered:
			return loaded
		case err := <-loaded:
			require.ErrorContains(t, err, errHTTPNotFirst.Error())
		case <-time.After(10 * time.Second):
			t.Fatal("the failing config's load neither started nor failed")
		}
	}
}

// CaddyModule returns the Caddy module information.
func (failStart) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "fair_queue_test_failstart",
		New: func() caddy.Module { return new(failStart) },
	}
}

// Start waits for the test if the http app serves, then fails.
func (a failStart) Start() error {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", a.Port), time.Second)
	if err != nil {
		return errHTTPNotFirst
	}
	c.Close()
	failing.entered <- struct{}{}
	<-failing.release
	return errors.New("started, then failed (test)")
}

// Stop implements caddy.App.
func (failStart) Stop() error { return nil }
