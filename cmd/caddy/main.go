// Command caddy is Caddy with Browser Grid compiled in: the same program
// 'xcaddy build --with github.com/browsergrid/caddy-browser-grid' makes.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules, as the stock binary has them.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// Every module of this project.
	_ "github.com/browsergrid/caddy-browser-grid"
)

func main() {
	caddycmd.Main()
}
