package main

// The registry section: the time of one select-and-claim in Redis at N =
// 100, 1,000 and 10,000 workers, for every policy, beside an O(N)
// scan (registry_baseline.lua) on the same redis-server in the same run.
// The bench starts its own redis-server (found on PATH) on a free port in
// a temp dir.
//
//	gridbench -only registry          # about 30 s
//	gridbench -only registry -quick   # a few seconds, figures not meaningful

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

func init() {
	register(section{name: "registry", order: 20, run: runRegistry})
}

//go:embed registry_baseline.lua
var regBaselineLua string

var regBaseline = redis.NewScript(regBaselineLua)

// The figures are taken with limits that never refuse (every claim is
// released before the next), so each call does a full decision.
var regLimits = selection.Limits{MaxConcurrent: 5, MaxLifetime: 1_000_000, StaleAfter: 60 * time.Second, MaxScan: 16}

func runRegistry(cfg *config) error {
	w := cfg.out
	reg, rdb, stop, err := regOpen()
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()

	budget := 700 * time.Millisecond
	if cfg.quick {
		budget = 60 * time.Millisecond
	}
	sizes := []int{100, 1_000, 10_000}
	policies := []registry.Policy{registry.LifetimeFirst, registry.Vnode, registry.FairShare}
	type row struct {
		n        int
		claim    map[registry.Policy]time.Duration
		baseline time.Duration
		samples  map[string]int
	}
	var rows []row
	for _, n := range sizes {
		pool := fmt.Sprintf("bench%d", n)
		setup := time.Now()
		if err := regPopulate(ctx, reg, rdb, pool, n); err != nil {
			return err
		}
		fmt.Fprintf(w, "(N=%d: %d workers registered twice, in the registry and in the O(N) scan's layout, in %s)\n",
			n, n, time.Since(setup).Round(10*time.Millisecond))
		r := row{n: n, claim: map[registry.Policy]time.Duration{}, samples: map[string]int{}}
		for _, p := range policies {
			req := registry.ClaimRequest{Pool: pool, Policy: p, Limits: regLimits, Holder: "gridbench"}
			var lease string
			d, k, err := regMeasure(budget, func() error {
				return reg.Release(ctx, pool, lease)
			}, func() error {
				c, err := reg.Claim(ctx, req)
				if err == nil {
					lease = c.LeaseID
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("claim %s at N=%d: %w", p, n, err)
			}
			r.claim[p], r.samples[string(p)] = d, k
		}
		keys := []string{pool + ":cluster:active_connections", pool + ":cluster:lifetime_connections"}
		var last string
		d, k, err := regMeasure(budget, func() error {
			if last == "" {
				return nil
			}
			return rdb.HIncrBy(ctx, keys[0], last, -1).Err()
		}, func() error {
			res, err := regBaseline.Run(ctx, rdb, keys, "chromium", regLimits.MaxConcurrent, regLimits.MaxLifetime,
				time.Now().Unix(), 60, pool+":worker:").Text()
			last = res
			return err
		})
		if err != nil {
			return fmt.Errorf("baseline at N=%d: %w", n, err)
		}
		r.baseline, r.samples["baseline"] = d, k
		rows = append(rows, r)
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "Select-and-claim in Redis, median time of one call as a client sees it (µs), one client, local redis-server:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workers | lifetime_first | vnode | fair_share | O(N) scan | scan / lifetime_first |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %.1f× |\n", r.n, regUS(r.claim[registry.LifetimeFirst]), regUS(r.claim[registry.Vnode]),
			regUS(r.claim[registry.FairShare]), regUS(r.baseline), float64(r.baseline)/float64(r.claim[registry.LifetimeFirst]))
	}
	fmt.Fprintln(w)
	first, last := rows[0], rows[len(rows)-1]
	fmt.Fprintf(w, "Growth from N=%d to N=%d: ", first.n, last.n)
	for _, p := range policies {
		fmt.Fprintf(w, "%s %.2f×, ", p, float64(last.claim[p])/float64(first.claim[p]))
	}
	fmt.Fprintf(w, "O(N) scan %.1f×.\n", float64(last.baseline)/float64(first.baseline))
	mid := rows[1]
	speedup := float64(mid.baseline) / float64(mid.claim[registry.LifetimeFirst])
	growth := float64(last.claim[registry.LifetimeFirst]) / float64(first.claim[registry.LifetimeFirst])
	fmt.Fprintf(w, "Targets: at N=1,000 claim ≥ 10× faster than the scan: %.1f× (%s); growth N=100→10,000 ≤ 2×: %.2f× (%s).\n",
		speedup, regVerdict(speedup >= 10), growth, regVerdict(growth <= 2))
	fmt.Fprintf(w, "Samples per cell (claim: claim + untimed release; scan: call + untimed HINCRBY -1): ")
	for _, r := range rows {
		fmt.Fprintf(w, "N=%d %v; ", r.n, r.samples)
	}
	fmt.Fprintln(w)
	return nil
}

func regVerdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func regUS(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Nanoseconds())/1e3, 'f', 0, 64)
}

// regMeasure times op, running undo (untimed) after each, until budget has
// passed (at least 5 calls, at most 5,000), and returns the median.
func regMeasure(budget time.Duration, undo, op func() error) (time.Duration, int, error) {
	for range 5 { // warm up: EVALSHA cache, connections
		if err := op(); err != nil {
			return 0, 0, err
		}
		if err := undo(); err != nil {
			return 0, 0, err
		}
	}
	var ds []time.Duration
	start := time.Now()
	for len(ds) < 5 || (time.Since(start) < budget && len(ds) < 5000) {
		t := time.Now()
		if err := op(); err != nil {
			return 0, 0, err
		}
		ds = append(ds, time.Since(t))
		if err := undo(); err != nil {
			return 0, 0, err
		}
	}
	slices.Sort(ds)
	return ds[len(ds)/2], len(ds), nil
}

// regPopulate registers n workers in the registry's pool and writes the same
// workers in the O(N) scan's layout (worker hash with a TTL, counters in two
// hashes) for the baseline.
func regPopulate(ctx context.Context, reg *registry.Registry, rdb *redis.Client, pool string, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				err := reg.Register(ctx, registry.Registration{Pool: pool, ID: fmt.Sprintf("w%05d", i), BrowserType: "chromium",
					Addr: "127.0.0.1:" + strconv.Itoa(10000+i%50000), Path: "/playwright", TTL: time.Hour})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("registering %d workers: %w", n, err)
	}
	pipe := rdb.Pipeline()
	now := strconv.FormatInt(time.Now().Unix(), 10)
	for i := range n {
		field := fmt.Sprintf("chromium:w%05d", i)
		key := pool + ":worker:" + field
		pipe.HSet(ctx, key, "browserType", "chromium", "wsEndpoint", "ws://127.0.0.1:3131/playwright", "status", "available", "lastHeartbeat", now)
		pipe.Expire(ctx, key, time.Hour)
		pipe.HSet(ctx, pool+":cluster:active_connections", field, 0)
		pipe.HSet(ctx, pool+":cluster:lifetime_connections", field, 0)
		if i%1000 == 999 || i == n-1 {
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("writing the baseline's workers: %w", err)
			}
		}
	}
	return nil
}

type regServer struct {
	addr string
	dir  string
	cmd  *exec.Cmd
}

func (s *regServer) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	_ = os.RemoveAll(s.dir)
}

// regStartRedis starts a private redis-server on a free port in a temp dir.
// regOpen starts a redis-server and returns a registry over it (claims
// hand no stale workers to background expiry, so timings are the
// script's own), its client, and a function that stops both.
func regOpen() (*registry.Registry, *redis.Client, func(), error) {
	srv, err := regStartRedis()
	if err != nil {
		return nil, nil, nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 8})
	stop := func() { rdb.Close(); srv.stop() }
	return registry.New(rdb, registry.Options{NoStaleExpiry: true}), rdb, stop, nil
}

func regStartRedis() (*regServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found on PATH (make deps installs it)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "gridbench-redis-")
	if err != nil {
		return nil, err
	}
	s := &regServer{addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning")
	s.cmd.Dir = dir
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s did not start: %w", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
