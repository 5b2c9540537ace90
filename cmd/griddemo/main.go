// Command griddemo is `make run`: it starts a whole local grid (Redis, real
// Chromium workers through Playwright's browser server, Caddy serving wss://
// with its internal CA), runs demo Playwright clients of each version
// (1.64 and 1.65 on workers of their own version) through it, prints
// what happened, and keeps the grid running until Ctrl-C, when it stops
// every process it started.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/localgrid"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func main() {
	var cfg localgrid.Config
	flag.IntVar(&cfg.Workers, "workers", envInt("WORKERS", 3), "number of Chromium workers (env WORKERS)")
	flag.IntVar(&cfg.HTTPSPort, "https-port", envInt("HTTPS_PORT", 8443), "Caddy's HTTPS port (env HTTPS_PORT)")
	flag.IntVar(&cfg.HTTPPort, "http-port", envInt("HTTP_PORT", 8080), "Caddy's HTTP port (env HTTP_PORT)")
	flag.IntVar(&cfg.AdminPort, "admin-port", envInt("ADMIN_PORT", 2019), "Caddy's admin port (env ADMIN_PORT)")
	flag.IntVar(&cfg.RedisPort, "redis-port", envInt("REDIS_PORT", 6390), "Redis port (env REDIS_PORT)")
	flag.IntVar(&cfg.MaxLifetime, "max-lifetime", envInt("MAX_LIFETIME", 10), "sessions per worker before it restarts (env MAX_LIFETIME)")
	flag.IntVar(&cfg.MaxConcurrent, "max-concurrent", envInt("MAX_CONCURRENT", 2), "sessions at once per worker (env MAX_CONCURRENT)")
	sessions := flag.Int("sessions", envInt("SESSIONS", 36), "demo sessions to run (env SESSIONS)")
	clients := flag.Int("clients", envInt("CLIENTS", 3), "demo sessions at once (env CLIENTS)")
	pwVersions := flag.String("playwright-versions", envStr("PLAYWRIGHT_VERSIONS", "1.64,1.65"), "playwright-core versions the workers load, in turn, and the demo's clients run, comma-separated (env PLAYWRIGHT_VERSIONS; '' for one version)")
	exitAfter := flag.Bool("exit", os.Getenv("EXIT_AFTER_DEMO") == "1", "stop the grid after the demo instead of waiting for Ctrl-C (env EXIT_AFTER_DEMO=1)")
	flag.Parse()
	cfg.Log = os.Stdout
	for _, v := range strings.Split(*pwVersions, ",") {
		if v = strings.TrimSpace(v); v != "" {
			cfg.PlaywrightVersions = append(cfg.PlaywrightVersions, v)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	fmt.Println("Starting a local Browser Grid…")
	g, err := localgrid.Start(ctx, cfg)
	if err != nil {
		var pe *localgrid.PortInUseError
		if errors.As(err, &pe) {
			fmt.Fprintf(os.Stderr, "griddemo: %v\n  for example: make run %s=%d\n", err, pe.Var, pe.Port+1)
		} else {
			fmt.Fprintf(os.Stderr, "griddemo: %v\n", err)
		}
		os.Exit(1)
	}
	defer func() {
		fmt.Println("\nStopping the grid (workers, Caddy, Redis)…")
		g.Stop()
		fmt.Println("Stopped. Nothing is left running.")
	}()

	code := demo(ctx, g, *sessions, *clients, cfg.PlaywrightVersions)
	if *exitAfter || ctx.Err() != nil {
		if code != 0 {
			g.Stop()
			os.Exit(code)
		}
		return
	}
	fmt.Printf("\nThe grid keeps running. Connect your own Playwright client:\n")
	fmt.Printf("  cd playwright && NODE_EXTRA_CA_CERTS=%s node -e \"require('playwright-core').chromium.connect('%s').then(b => b.newPage()).then(p => p.goto('about:blank')).then(() => process.exit())\"\n", g.RootCA(), g.URL())
	fmt.Printf("  bin/caddy grid status --address 127.0.0.1:%d --watch   # the staircase, live\n", cfg.AdminPort)
	fmt.Printf("  %s   # the grid's live page (user %s, password %s)\n", g.UIURL(), localgrid.UIUser, g.UIPassword())
	fmt.Println("Press Ctrl-C to stop.")
	<-ctx.Done()
}

// watcher samples the pool through the admin API while the demo runs.
type watcher struct {
	mu           sync.Mutex
	served       map[string]int    // worker → highest lifetime seen
	version      map[string]string // worker → the Playwright version it serves
	order        []string          // workers in order of first sight
	gone         map[string]bool
	maxDraining  map[string]int // version → most of its workers draining at once
	staircases   []string
	lastSnapshot []localgrid.Worker
}

func (w *watcher) sample(p localgrid.Pool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	present := map[string]bool{}
	draining := map[string]int{}
	for _, wk := range p.Workers {
		present[wk.ID] = true
		if _, ok := w.served[wk.ID]; !ok {
			w.order = append(w.order, wk.ID)
			w.served[wk.ID] = 0
		}
		w.version[wk.ID] = wk.PlaywrightVersion
		if wk.Lifetime > w.served[wk.ID] {
			w.served[wk.ID] = wk.Lifetime
		}
		if wk.Status == "draining" {
			draining[wk.PlaywrightVersion]++
		}
	}
	for id := range w.served {
		if !present[id] {
			w.gone[id] = true
		}
	}
	for v, n := range draining {
		w.maxDraining[v] = max(w.maxDraining[v], n)
	}
	w.lastSnapshot = p.Workers
}

func demo(ctx context.Context, g *localgrid.Grid, sessions, clients int, versions []string) int {
	w := &watcher{served: map[string]int{}, version: map[string]string{}, gone: map[string]bool{}, maxDraining: map[string]int{}}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := time.Now()
		for watchCtx.Err() == nil {
			if p, err := g.PoolStatus(watchCtx, "chromium"); err == nil {
				w.sample(p)
				if time.Now().After(next) {
					w.mu.Lock()
					w.staircases = append(w.staircases, staircase(p.Workers))
					w.mu.Unlock()
					next = time.Now().Add(2 * time.Second)
				}
			}
			select {
			case <-watchCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	// One client process per version, at once: each session of a version's
	// client can only have been served by a worker of that version, since
	// Playwright's server refuses (428) any client of another major.minor.
	if len(versions) == 0 {
		versions = []string{""}
	}
	fmt.Printf("\nDemo: %d Playwright sessions, %d at a time per client version, through %s\n", sessions, clients, g.URL())
	start := time.Now()
	var (
		outMu      sync.Mutex
		ok, failed int
		runs       sync.WaitGroup
	)
	perVersion := map[string]int{}
	for i, v := range versions {
		n := sessions / len(versions)
		if i < sessions%len(versions) {
			n++
		}
		args := []string{filepath.Join("playwright", "client.mjs"), "run", "--url", g.URL(),
			"--sessions", strconv.Itoa(n), "--concurrency", strconv.Itoa(clients)}
		if v != "" {
			args = append(args, "--playwright-version", v)
		}
		cmd := exec.CommandContext(ctx, "node", args...)
		cmd.Env = append(os.Environ(), "NODE_EXTRA_CA_CERTS="+g.RootCA())
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			fmt.Fprintf(os.Stderr, "griddemo: %v\n", err)
			return 1
		}
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "griddemo: starting the demo client: %v\n", err)
			return 1
		}
		runs.Add(1)
		go func() {
			defer runs.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var ev struct {
					Event   string `json:"event"`
					N       int    `json:"n"`
					OK      bool   `json:"ok"`
					Title   string `json:"title"`
					Error   string `json:"error"`
					MS      int    `json:"ms"`
					Version string `json:"version"`
				}
				if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Event != "session" {
					continue
				}
				served := majorMinor(ev.Version)
				outMu.Lock()
				if ev.OK {
					ok++
					perVersion[served]++
					fmt.Printf("  client %-7s session %3d  ok    %-18q %5d ms  served by a Playwright %s worker\n", ev.Version, ev.N, ev.Title, ev.MS, served)
				} else {
					failed++
					fmt.Printf("  client %-7s session %3d  FAIL  %s\n", ev.Version, ev.N, ev.Error)
				}
				outMu.Unlock()
			}
			_ = cmd.Wait()
		}()
	}
	runs.Wait()
	elapsed := time.Since(start)
	time.Sleep(300 * time.Millisecond) // one more admin sample after the last release
	stopWatch()
	wg.Wait()
	if p, err := g.PoolStatus(ctx, "chromium"); err == nil {
		w.sample(p)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Printf("\nResult: %d of %d sessions succeeded, %d failed, in %s.\n", ok, sessions, failed, elapsed.Round(100*time.Millisecond))
	fmt.Println("\nSessions served per worker (a worker restarts at the lifetime limit and comes back as a new worker):")
	total := 0
	for _, id := range w.order {
		state := "running"
		if w.gone[id] {
			state = "restarted"
		}
		pv := w.version[id]
		if pv == "" {
			pv = "-"
		}
		fmt.Printf("  %-40s Playwright %-5s %3d sessions  %s\n", id, pv, w.served[id], state)
		total += w.served[id]
	}
	for _, v := range versions {
		if v == "" {
			continue
		}
		byWorkers := 0
		for id, n := range w.served {
			if w.version[id] == v {
				byWorkers += n
			}
		}
		fmt.Printf("  Playwright %s: %d sessions of %s clients succeeded; its workers served %d sessions\n", v, perVersion[v], v, byWorkers)
	}
	most := 0
	for _, n := range w.maxDraining {
		most = max(most, n)
	}
	fmt.Printf("  %d sessions counted across %d workers; %d restarts; at most %d worker(s) of one version draining at once\n",
		total, len(w.order), len(w.gone), most)
	fmt.Println("\nThe lifetime staircase over the run (one line every two seconds, highest first):")
	for _, s := range w.staircases {
		fmt.Println("  " + s)
	}
	fmt.Println("  " + staircase(w.lastSnapshot) + "   (now)")
	if failed > 0 {
		return 1
	}
	return 0
}

// majorMinor is "1.64" of "1.64.1".
func majorMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}

// staircase renders workers' lifetimes, highest first.
func staircase(ws []localgrid.Worker) string {
	lt := make([]int, 0, len(ws))
	for _, w := range ws {
		lt = append(lt, w.Lifetime)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(lt)))
	parts := make([]string, len(lt))
	for i, v := range lt {
		parts[i] = fmt.Sprintf("%2d %s", v, strings.Repeat("█", v))
	}
	return strings.Join(parts, " | ")
}

func envStr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}
