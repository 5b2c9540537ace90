// Package caddybrowsergrid is what xcaddy builds in: importing it registers
// every Caddy module of Browser Grid for Caddy, as caddy-l4's root package
// does for its modules.
//
//	xcaddy build --with github.com/browsergrid/caddy-browser-grid
package caddybrowsergrid

import (
	// Registers the grid app, the browser_grid handler, its selection
	// policies, upstream source, admin API and 'caddy grid' subcommand.
	_ "github.com/browsergrid/caddy-browser-grid/caddygrid"
)
