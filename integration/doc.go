// Package integration holds the end-to-end tests of the fair_queue
// plugin: real Caddy processes built from cmd/caddy, real redis-server
// processes (internal/redistest) and a streaming mock LLM upstream
// (internal/mockllm), driven over HTTP the way users drive them.
//
// The tests start Caddy and the mock with internal/harness, which builds
// the Caddy binary once per run, with the go command that runs them, and
// starts every Caddy on free loopback ports with its own admin endpoint,
// so they need no fixed port and leave no process behind.
// Run them with:
//
//	go test -race -count=1 ./integration/
//
// A failing test prints the tail of each Caddy's log; with
// INTEGRATION_CADDY_LOGS=1 every test prints the whole logs.
package integration
