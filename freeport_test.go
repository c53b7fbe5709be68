package caddyfairqueue

import (
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
)

// portsTaken counts the ports freePort handed out in this process.
var portsTaken atomic.Int32

// freePort returns a loopback port nothing listens on, for a server a
// test starts a moment later. A port the kernel picks (listening on port
// 0, then closing) may go to another process in that moment: go test
// runs packages side by side, and their Caddy servers (listening with
// SO_REUSEPORT) and clients take ports too; a request then reached
// another test's server (a 404 from its admin endpoint). So the port
// comes from below the kernel's ephemeral range (32768 and up: no
// outgoing connection or port-0 listener takes it), from a block of 200
// of this process's own, and is never handed out twice by it.
func freePort(t *testing.T) int {
	t.Helper()
	base := 10000 + (os.Getpid()%100)*200
	for range 200 {
		p := base + int(portsTaken.Add(1)%200)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err == nil {
			ln.Close()
			return p
		}
	}
	t.Fatal("no free port in this process's block")
	return 0
}
