package caddyfairqueue

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/require"
)

// serverURL is the http:// URL of the address that server name of the
// config in force listens on, for a server configured to listen on
// 127.0.0.1:0 so that the kernel picks the port as it binds. A port
// taken from freePort is free only until Caddy binds it, and Caddy binds
// with SO_REUSEPORT: another Caddy that took the same port meanwhile (a
// test binary of another package, or another run) shares it, and the
// kernel hands each new connection to either, so a request may be
// answered by the other (its admin endpoint's 404). A port 0 also gives
// each config load a port of its own: a request sent after a reload
// reaches the new config's server, never the old one, which may still
// accept for a moment after the load returns (Caddy shuts it down in the
// background) and resets the connections left in its listen queue as it
// closes.
func serverURL(t *testing.T, name string) string {
	t.Helper()
	app, err := caddy.ActiveContext().AppIfConfigured("http")
	require.NoError(t, err)
	srv := app.(*caddyhttp.App).Servers[name]
	require.NotNil(t, srv, "no server %s in the config in force", name)
	lns := srv.Listeners()
	require.Len(t, lns, 1)
	return "http://" + lns[0].Addr().String()
}
