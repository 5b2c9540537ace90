package caddygrid_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestMaxBatchReaches: the grid option max_batch reaches the registry
// that sends the claims, and a reload that changes it (or drops it: the
// default) changes it there, although the registry outlives the reload.
func TestMaxBatchReaches(t *testing.T) {
	g := newGrid(t)
	opts := func(global string) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), global: global, site: `
	route /playwright/* {
		browser_grid chromium
	}`}
	}
	c := startCaddy(t, opts("max_batch 1"))
	started := func(want string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, "grid started with "+want, func() bool {
			lines := strings.Split(c.proc.Output(), "\n")
			for i := len(lines) - 1; i >= 0; i-- {
				if strings.Contains(lines[i], `"grid started"`) {
					return strings.Contains(lines[i], want)
				}
			}
			return false
		})
	}
	started(`"max_batch":1}`)
	c.reload(opts("max_batch 8"))
	started(`"max_batch":8}`)
	c.reload(opts(""))
	started(`"max_batch":32}`)
}

// TestMaxBatchFailedReload: a reload that fails after starting the new
// config's grid app leaves the running config's max_batch (and lease_ttl)
// in force, and the admin API answering from it. Two ways to fail late:
// a site on a taken port (Caddy stops the apps it started) and a config
// loader that cannot load (admin.config.load: Caddy fails the reload
// after every app started and only cleans them up; the http app's
// Cleanup stops its servers).
func TestMaxBatchFailedReload(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	good := caddyOpts{redisURL: g.redis.URL(), global: "max_batch 1", site: `
	route /playwright/* {
		browser_grid chromium
	}`}
	c := startCaddy(t, good)
	// the failed configs: batches of up to 256, leases of 5m
	bad := good
	bad.global = "max_batch 256\n\t\tlease_ttl 5m"

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	unstartable := bad
	unstartable.sites = fmt.Sprintf("http://%s {\n\trespond ok\n}\n", taken.Addr())
	// Apps start in random order: five tries leave one chance in 32
	// that the grid app never started before the http app failed.
	for range 5 {
		if code, out := c.tryReload(unstartable); code == 0 || !strings.Contains(out, "address already in use") {
			t.Fatalf("reload with a site on a taken port: exit %d, want a failure naming it:\n%s", code, out)
		}
	}
	if code, body := loadWithFailingLoader(t, c, bad, fmt.Sprintf("127.0.0.1:%d", testenv.PickPort(t))); code == http.StatusOK ||
		!strings.Contains(string(body), "loading dynamic config") {
		t.Fatalf("load with a config loader that fails: %d %s, want a failure naming it", code, body)
	}
	if code, body := c.admin(http.MethodGet, "/grid/pools"); code != http.StatusOK {
		t.Errorf("GET /grid/pools after the failed reloads: %d %s; want 200 from the running config", code, body)
	}
	// lease_ttl: the running config's 30s, not the failed one's 5m
	s := mustDial(t, c.url("/playwright/chromium"))
	leases, err := g.rdb.ZRangeWithScores(context.Background(), "{grid:chromium}:lease_expiry", 0, -1).Result()
	if err != nil || len(leases) != 1 {
		t.Fatalf("leases: %v, %v; want one", leases, err)
	}
	if left := time.Until(time.UnixMilli(int64(leases[0].Score))); left > time.Minute {
		t.Errorf("the session's lease expires in %s: the failed config's lease_ttl 5m is in force, want 30s", left.Round(time.Second))
	}
	s.close()

	// max_batch: the running config's 1, so every claim and release of a
	// burst of concurrent sessions goes alone (at 256 they go together)
	var wg sync.WaitGroup
	errs := make(chan error, 32*3)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				s, err := dial(context.Background(), c.url("/playwright/chromium"))
				if err != nil {
					errs <- err
					return
				}
				s.close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a session of the burst: %v", err)
	}
	for _, script := range []string{"claim", "lease"} {
		all := c.metric(`caddy_grid_redis_batch_calls_count{pool="chromium",script="` + script + `"}`)
		alone := c.metric(`caddy_grid_redis_batch_calls_bucket{pool="chromium",script="` + script + `",le="1"}`)
		if all == 0 || alone != all {
			t.Errorf("script %s: %v of %v calls to Redis went alone; want all (max_batch 1 of the running config)", script, alone, all)
		}
	}
}

// loadWithFailingLoader POSTs o as JSON to the admin API's /load, with a
// config loader (admin.config.load) that fetches from addr, where nothing
// listens: Caddy starts every app of the config, then fails the load.
func loadWithFailingLoader(t *testing.T, c *caddy, o caddyOpts, addr string) (int, []byte) {
	t.Helper()
	return loadEdited(t, c, o, func(cfg map[string]any) {
		admin, _ := cfg["admin"].(map[string]any)
		if admin == nil {
			t.Fatalf("adapted config without admin: %v", cfg)
		}
		admin["config"] = map[string]any{
			"persist": false,
			"load":    map[string]any{"module": "http", "url": "http://" + addr + "/", "timeout": "5s"},
		}
	})
}

// loadEdited adapts o, lets edit change the JSON config, and POSTs it to
// the admin API's /load; it returns the answer once the replaced
// listeners are closed.
func loadEdited(t *testing.T, c *caddy, o caddyOpts, edit func(cfg map[string]any)) (int, []byte) {
	t.Helper()
	c.write(o)
	out, err := exec.Command(caddyBin(t), "adapt", "--config", c.config, "--adapter", "caddyfile").Output()
	if err != nil {
		t.Fatalf("caddy adapt: %v", err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("decoding the adapted config: %v\n%s", err, out)
	}
	edit(cfg)
	body, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/load", c.adminPort), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST /load: %v", err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	c.replacedListenersClosed()
	return resp.StatusCode, got
}
