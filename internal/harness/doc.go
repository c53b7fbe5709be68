// Package harness starts what the tests and the bench run from the
// outside: child processes in process groups of their own with their
// output in a log file (Proc), the Caddy binary of this checkout built
// once per test binary and Caddy processes on free loopback ports
// (StartCaddy, StartCaddyfile), the in-process mock LLM (StartMockLLM),
// and streaming requests that hold a queue's place (StartStream).
//
// A test package that starts Caddy calls Main from its TestMain, which
// gives the Caddy binary a directory and removes it afterwards:
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
//
// A failing test prints the tail of each Caddy's log; with
// INTEGRATION_CADDY_LOGS=1 every test prints the whole logs.
//
// The package builds without build tags, so that go vet ./... sees it,
// and for unix only: it signals process groups.
package harness
