package main

// The redis-cpu section: Redis CPU per session through bin/caddy, against
// Redis CPU per PING. Eight bin/grid-worker agents with every default but
// -max-concurrent (their heartbeats every 10 s are part of the cost), one
// bin/caddy with the grid app's defaults; each session is a WebSocket
// connect, one 64-byte echo and a close, from 4 clients at once. A round's
// figure is INFO cpu's delta from before its sessions until the pool's
// session records are gone (the agents have written every end). The
// baseline is redis-benchmark's PINGs (4 clients) on the same Redis, in
// rounds taking turns with the sessions', divided by the PINGs
// commandstats counted. Beside it, the commands a session costs, from
// commandstats over the sessions' rounds.
//
//	gridbench -only redis-cpu                     # about 10 s
//	gridbench -only redis-cpu -pprof caddy.pprof  # also a CPU profile of bin/caddy
//	gridbench -only redis-cpu -quick              # a smoke run

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"time"
)

func init() {
	register(section{name: "redis-cpu", order: 30, run: runRedisCPU})
}

var pprofPath = flag.String("pprof", "", "redis-cpu: write a CPU profile of bin/caddy serving grid sessions (4 clients, 10 s) to this file")

// benchPool is the pool the agents of the sections serve.
const benchPool = "bench"

func runRedisCPU(cfg *config) error {
	out := cfg.out
	agents, clients, sessions, pings, rounds := 8, 4, 1000, 200_000, 4
	profileFor := 10 * time.Second
	if cfg.quick {
		sessions, pings, rounds, profileFor = 100, 20_000, 2, 2*time.Second
	}
	bench, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return fmt.Errorf("redis-benchmark not found on PATH (the redis-tools package; make deps installs it)")
	}
	w, err := newWorld()
	if err != nil {
		return err
	}
	defer w.close()
	ctx := context.Background()
	if err := w.startAgents(agents, benchPool, "--max-concurrent", "8"); err != nil {
		return err
	}
	cad, err := w.startCaddy("caddy", 1, func(a []string) string { return gridSite(a[0], benchPool, "") })
	if err != nil {
		return err
	}
	grid := route{name: "browser_grid", url: "ws://" + cad.sites[0] + "/"}
	settle := func() (int64, error) { return w.waitNoSessions(benchPool, 15*time.Second) }
	if _, _, err := (load{clients: clients, total: 40, echo: 64}).run(grid); err != nil {
		return fmt.Errorf("warming up: %w\n%s", err, cad.tail())
	}
	if _, err := settle(); err != nil {
		return err
	}

	var sessCPU, pingCPU cpu
	sessStats := cmdStats{}
	var pinged float64
	var took time.Duration
	var left int64
	port := strconv.Itoa(w.port)
	for r := range rounds {
		c0, err := readCPU(ctx, w.rdb)
		if err != nil {
			return err
		}
		s0, err := readCommandStats(ctx, w.rdb)
		if err != nil {
			return err
		}
		n := sessions/rounds + boolInt(r < sessions%rounds)
		_, d, err := (load{clients: clients, total: n, echo: 64}).run(grid)
		if err != nil {
			return fmt.Errorf("grid sessions: %w\n%s", err, cad.tail())
		}
		took += d
		l, err := settle()
		if err != nil {
			return err
		}
		left = max(left, l)
		s1, err := readCommandStats(ctx, w.rdb)
		if err != nil {
			return err
		}
		c1, err := readCPU(ctx, w.rdb)
		if err != nil {
			return err
		}
		cmd := exec.Command(bench, "-t", "ping", "-c", strconv.Itoa(clients), "-n", strconv.Itoa(pings/rounds), "-q", "-h", "127.0.0.1", "-p", port)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("redis-benchmark: %w\n%s", err, b)
		}
		c2, err := readCPU(ctx, w.rdb)
		if err != nil {
			return err
		}
		s2, err := readCommandStats(ctx, w.rdb)
		if err != nil {
			return err
		}
		sessCPU, pingCPU = sessCPU.plus(c1.minus(c0)), pingCPU.plus(c2.minus(c1))
		sessStats.add(s1.minus(s0))
		pinged += s2.minus(s1)["ping"].calls
	}
	// what gridbench itself sent
	delete(sessStats, "info")
	delete(sessStats, "hlen")

	perSession, perPing := sessCPU.per(float64(sessions)), pingCPU.per(pinged)
	fmt.Fprintf(out, "%d agents (fake launcher, -max-concurrent 8, other defaults), one bin/caddy (grid defaults), %s sessions from %d clients\n", agents, count(sessions), clients)
	fmt.Fprintf(out, "(connect, one 64-byte echo, close) at %s sessions/s, in %d rounds taking turns with redis-benchmark -t ping -c %d\n",
		f(float64(sessions)/took.Seconds(), 0), rounds, clients)
	fmt.Fprintf(out, "(%s PINGs in all: -t ping runs both its inline and its multibulk test). INFO cpu counts in clock ticks: the user/sys\n", count(int(pinged)))
	fmt.Fprintf(out, "split is sampled, the total exact.\n\n")
	if left > 0 {
		fmt.Fprintf(out, "(Up to %d session records were still in Redis 15 s after a round's sessions closed.)\n\n", left)
	}
	su, ss, st := perSession.micros()
	pu, ps, pt := perPing.micros()
	table(out, []string{"Redis CPU", "user (µs)", "sys (µs)", "total (µs)"},
		[]string{"per grid session", su, ss, st},
		[]string{"per PING (redis-benchmark)", pu, ps, pt})
	goals(out, goal{"Redis CPU per session", st + " µs", "per PING " + pt + " µs", ratio(perSession.total(), perPing.total()),
		"≤ 7× a PING", perSession.total() <= 7*perPing.total()})

	fmt.Fprintf(out, "Redis commands per session (commandstats over the sessions' rounds / %d sessions). Claim, end and heartbeat are each one fcall,\n", sessions)
	fmt.Fprintln(out, "whose time holds the commands its function ran, listed too. commandstats times a command by the clock: a Redis preempted")
	fmt.Fprintln(out, "inside one (the cores are shared with Caddy, the agents and the clients) counts the wait, so its µs can pass the CPU above.")
	fmt.Fprintln(out)
	names := make([]string, 0, len(sessStats))
	for k := range sessStats {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return sessStats[names[i]].usec > sessStats[names[j]].usec })
	var rows [][]string
	for _, k := range names {
		s := sessStats[k]
		rows = append(rows, []string{k, f(s.calls/float64(sessions), 2), f(s.usec/float64(sessions), 2), f(s.perCall(), 2)})
	}
	table(out, []string{"command", "calls per session", "µs per session", "µs per call"}, rows...)

	if *pprofPath != "" {
		n, err := profileCaddy(cad.admin, *pprofPath, grid, clients, profileFor)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "CPU profile of bin/caddy over %s, %d grid sessions from %d clients: %s (go tool pprof -top bin/caddy %s).\n",
			profileFor, n, clients, *pprofPath, *pprofPath)
	}
	return nil
}

// profileCaddy saves a CPU profile of Caddy (its admin API) to path while
// clients open sessions at r for about d, and returns how many they
// opened.
func profileCaddy(admin, path string, r route, clients int, d time.Duration) (int, error) {
	secs := max(1, int(d.Seconds()))
	done := make(chan error, 1)
	go func() {
		resp, err := wsClient.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs))
		if err != nil {
			done <- fmt.Errorf("profiling caddy: %w", err)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			done <- fmt.Errorf("profiling caddy: %s", resp.Status)
			return
		}
		f, err := os.Create(path)
		if err != nil {
			done <- err
			return
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			done <- fmt.Errorf("writing the profile: %w", err)
			return
		}
		done <- f.Close()
	}()
	// the load stays inside the profile's window, which opens when Caddy
	// reads the request
	time.Sleep(100 * time.Millisecond)
	lats, _, err := (load{clients: clients, d: time.Duration(secs)*time.Second - 300*time.Millisecond, echo: 64}).run(r)
	if err != nil {
		return 0, err
	}
	return len(lats), <-done
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
