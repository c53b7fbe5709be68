package harness

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// tcpListeners counts the TCP sockets of this host's network namespace
// that listen on port (/proc/net/tcp and tcp6); ok is false where they
// cannot be read.
func tcpListeners(port int) (n int, ok bool) {
	for _, path := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(path)
		if err != nil {
			if os.IsNotExist(err) {
				continue // no IPv6
			}
			return 0, false
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st ...: 0A is LISTEN.
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "0A" {
				continue
			}
			_, hexPort, found := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); found && err == nil && int(p) == port {
				n++
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return 0, false
		}
	}
	return n, true
}
