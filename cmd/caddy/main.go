// Command caddy is Caddy with its standard modules and the fair_queue
// plugin: the same binary as
//
//	xcaddy build --with github.com/fair-queue/caddy-fair-queue=.
//
// built with plain go build, for demos and the end-to-end tests in
// integration/.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/fair-queue/caddy-fair-queue"
)

func main() {
	caddycmd.Main()
}
