// Command grid-worker runs beside each browser of the grid: it launches a
// browser server (Playwright's, Chromium with CDP, any command that prints
// a ws:// endpoint, or fakebrowser), registers it in Redis, heartbeats,
// drains on the shutdown command or SIGTERM, and exits 0 for its
// supervisor to restart it (or respawns by itself with -respawn).
//
//	GRID_WORKER_SECRET=... grid-worker -redis redis://redis:6379/0 -launcher playwright -host 0.0.0.0 -advertise 10.20.0.7
//
// Caddy dials only an IP inside its grid's worker_networks (a host name
// such as -advertise worker-1 only with allow_worker_hostnames), and with
// its worker_secret set only records signed with the same secret.
//
// Every flag also reads an environment variable (grid-worker -help lists
// them). Exit codes: 0 after a drain or a signal, 1 when the agent gives
// up (Redis unreachable at start, a browser that crashed without
// -respawn), 2 for bad flags or timings. A second SIGTERM or SIGINT stops
// waiting for sessions.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

func run(args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := workeragent.ParseFlags(args, getenv, stderr)
	if errors.Is(err, workeragent.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "grid-worker: %v\n", err)
		return 2
	}
	log, err := workeragent.NewLogger(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "grid-worker: %v\n", err)
		return 2
	}
	defer log.Sync()
	redis.SetLogger(workeragent.RedisLogger(log))
	agent, err := workeragent.New(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "grid-worker: %v\n", err)
		return 2
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sigs
		log.Info("signal received; stopping (a registered browser drains first)", zap.String("signal", s.String()))
		cancel()
		s = <-sigs
		log.Warn("second signal; not waiting for sessions", zap.String("signal", s.String()))
		agent.Abort()
	}()

	if err := agent.Run(ctx); err != nil {
		log.Error("grid-worker stopped", zap.Error(err))
		return 1
	}
	return 0
}
