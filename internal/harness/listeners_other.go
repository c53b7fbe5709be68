//go:build !linux

package harness

// tcpListeners is not known outside Linux: ok is false.
func tcpListeners(int) (n int, ok bool) { return 0, false }
