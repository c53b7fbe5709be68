package harness

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"
)

// reloadCloseTimeout bounds the wait for the old config's server to
// close its listeners after a reload.
const reloadCloseTimeout = 30 * time.Second

// Reload is Load, returning once the server of the config in force
// before has closed its listeners. Caddy's reload answers as its old
// servers start shutting down, before they close their listeners: a
// connection accepted in between reaches the old config's handlers, and
// a test whose next request must reach the new config fails on a loaded
// machine. An idle connection of the old server tells: its shutdown
// closes the listeners, then the idle connections. A load that fails
// returns its error at once (the config in force stays), and so does one
// of the Caddyfile in force (Caddy keeps an unchanged config running).
func (c *Caddy) Reload(site string) error {
	if c.Caddyfile(site) == c.inForce() {
		return c.Load(site)
	}
	conn, r, err := c.idleConn()
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := c.Load(site); err != nil {
		return err
	}
	if err := conn.SetReadDeadline(time.Now().Add(reloadCloseTimeout)); err != nil {
		return err
	}
	if _, err := r.ReadByte(); err == nil {
		return fmt.Errorf("reload %s: the old server sent bytes on an idle connection", c.name)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("reload %s: the old config's server kept its idle connection %v after the load", c.name, reloadCloseTimeout)
	}
	return nil // closed (EOF or reset): the old server no longer accepts
}

// idleConn opens a connection to the site's port and leaves it idle
// after one request that Go's server answers itself (OPTIONS *, which
// reaches no handler of the config and writes no access log).
func (c *Caddy) idleConn() (net.Conn, *bufio.Reader, error) {
	conn, err := net.DialTimeout("tcp", c.hostPort(c.ports.HTTP), 10*time.Second)
	if err != nil {
		return nil, nil, fmt.Errorf("reload %s: %w", c.name, err)
	}
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		conn.Close()
		return nil, nil, err
	}
	r := bufio.NewReader(conn)
	if _, err := fmt.Fprintf(conn, "OPTIONS * HTTP/1.1\r\nHost: %s\r\n\r\n", c.hostPort(c.ports.HTTP)); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("reload %s: %w", c.name, err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("reload %s: OPTIONS *: %w", c.name, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		conn.Close()
		return nil, nil, fmt.Errorf("reload %s: OPTIONS * answered %s (close %v)", c.name, resp.Status, resp.Close)
	}
	return conn, r, nil
}
