// Package caddygrid holds the Caddy modules of Browser Grid: the grid app,
// the browser_grid handler, the selection policies, the dynamic upstream
// source, the admin API, the metrics, the Caddyfile directive and global
// option, and the 'caddy grid' subcommand.
package caddygrid
