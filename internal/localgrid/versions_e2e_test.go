package localgrid

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// ua163 is the User-Agent playwright-core 1.63.0's connect() sends (seen on
// the wire), used where a request is timed from Go.
const ua163 = "Playwright/1.63.0 (x64; debian 12) node/20.20"

// TestPlaywrightVersionRouting: one grid, workers of Playwright 1.64 and
// 1.65, clients of both at once over wss:// through bin/caddy. Every
// session succeeds, and each is served by a worker of its own version:
// the lifetimes of each version's workers add up to that version's
// sessions (and a Playwright server refuses a client of another version
// with 428, which would fail the session). A 1.63 client is refused with
// 428 naming 1.64 and 1.65 within 100 ms, and no worker is charged.
// Recycling stays staggered within each version: never two workers of one
// version draining at once.
func TestPlaywrightVersionRouting(t *testing.T) {
	const (
		workers     = 4
		maxLifetime = 4
		sessions    = 12 // per version
		lanes       = 2  // per version
	)
	versions := []string{"1.64", "1.65"}
	g := startGrid(t, Config{Workers: workers, MaxConcurrent: 2, MaxLifetime: maxLifetime, PlaywrightVersions: versions})
	ctx := context.Background()

	// The admin API shows each worker's version and the pool's versions.
	testenv.Eventually(t, 90*time.Second, "two available workers of each version in the admin API", func() bool {
		p, err := g.PoolStatus(ctx, "chromium")
		if err != nil || !slices.Equal(p.Versions, versions) {
			return false
		}
		n := map[string]int{}
		for _, w := range p.Workers {
			if w.Status == "available" {
				n[w.PlaywrightVersion]++
			}
		}
		return n["1.64"] == 2 && n["1.65"] == 2
	})

	rdb, err := registry.NewClient(g.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	reg := registry.New(rdb, registry.Options{})
	groups := map[string]string{}
	for _, v := range versions {
		groups[v] = registry.GroupPool("chromium", v)
	}

	// charged sums the lifetimes of every group, and counts the pool's
	// session records.
	charged := func() (lifetimes, sessions int) {
		infos, _, err := reg.InspectPool(ctx, "chromium")
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range allWorkers(infos) {
			lifetimes += w.Lifetime
		}
		ss, _, err := reg.Sessions(ctx, "chromium", 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return lifetimes, len(ss)
	}

	t.Run("a version no worker serves", func(t *testing.T) {
		life0, leases0 := charged()
		// A real 1.63 client.
		out, _ := client(t, g, "run", "--url", g.URL(), "--playwright-version", "1.63", "--timeout", "20000").CombinedOutput()
		var ev struct {
			Event, Version, Error, Detail string
			OK                            bool
		}
		for _, line := range strings.Split(string(out), "\n") {
			if json.Unmarshal([]byte(line), &ev) == nil && ev.Event == "session" {
				break
			}
		}
		if ev.OK || ev.Version != "1.63.0" {
			t.Fatalf("the 1.63 client: %+v, want a failed session of playwright-core 1.63.0\n%s", ev, out)
		}
		for _, want := range []string{"428", "Playwright 1.63", "1.64, 1.65"} {
			if !strings.Contains(ev.Detail, want) {
				t.Errorf("the 1.63 client's error does not say %q:\n%s", want, ev.Detail)
			}
		}
		t.Logf("the 1.63 client was told: %s", ev.Detail)

		// Timed, on a warm TLS connection: the whole answer within 100 ms.
		hc := httpsClient(t, g)
		var took []time.Duration
		for i := 0; i < 6; i++ {
			start := time.Now()
			code, body := upgrade(t, hc, g.URL(), ua163)
			d := time.Since(start)
			if code != http.StatusPreconditionRequired || !strings.Contains(body, "1.64, 1.65") {
				t.Fatalf("upgrade as a 1.63 client: %d %q, want 428 naming 1.64, 1.65", code, body)
			}
			if i > 0 { // the first one pays the TLS handshake
				took = append(took, d)
			}
		}
		slices.Sort(took)
		t.Logf("428 for 1.63 answered in %v (sorted, 5 requests)", took)
		if max := took[len(took)-1]; max > 100*time.Millisecond {
			t.Errorf("slowest 428 took %v, want within 100ms", max)
		}
		if life, leases := charged(); life != life0 || leases != leases0 {
			t.Errorf("after the refused 1.63 requests: lifetimes %d sessions %d, want %d and %d (no worker charged)", life, leases, life0, leases0)
		}
	})

	t.Run("a client without a version goes to any worker", func(t *testing.T) {
		hc := httpsClient(t, g)
		if code, body := upgrade(t, hc, g.URL(), ""); code != http.StatusSwitchingProtocols {
			t.Fatalf("plain WebSocket upgrade: %d %q, want 101 from some worker", code, body)
		}
		testenv.Eventually(t, 20*time.Second, "its slot to be released", func() bool {
			_, leases := charged()
			return leases == 0
		})
	})

	// Watch every group for the whole run.
	var (
		mu          sync.Mutex
		maxDraining = map[string]int{}
		seen        = map[string]map[string]int{} // version → worker → highest lifetime
	)
	for _, v := range versions {
		seen[v] = map[string]int{}
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for watchCtx.Err() == nil {
			for _, v := range versions {
				info, err := reg.Inspect(watchCtx, groups[v])
				if err != nil {
					continue
				}
				mu.Lock()
				draining := 0
				for _, w := range info.Workers {
					if w.Status == "retiring" || w.Status == "draining" {
						draining++
					}
					if w.Lifetime > seen[v][w.ID] {
						seen[v][w.ID] = w.Lifetime
					}
				}
				maxDraining[v] = max(maxDraining[v], draining)
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	// Sessions of the test above (the plain WebSocket one) are not this run's.
	base := map[string]map[string]int{}
	for _, v := range versions {
		base[v] = map[string]int{}
		info, err := reg.Inspect(ctx, groups[v])
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range info.Workers {
			base[v][w.ID] = w.Lifetime
		}
	}

	outs := make([][]byte, len(versions))
	errs := make([]error, len(versions))
	var wg sync.WaitGroup
	for i, v := range versions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = client(t, g, "run", "--url", g.URL(), "--playwright-version", v,
				"--sessions", strconv.Itoa(sessions), "--concurrency", strconv.Itoa(lanes)).CombinedOutput()
		}()
	}
	wg.Wait()
	stopWatch()
	<-watchDone

	for i, v := range versions {
		evs := parseEvents(t, outs[i])
		failed := 0
		for _, ev := range evs {
			if !ev.OK {
				failed++
				t.Errorf("%s session %d failed: %s", v, ev.N, ev.Error)
			}
		}
		if errs[i] != nil || len(evs) != sessions || failed > 0 {
			t.Fatalf("%s client: %v; %d session results, %d failed, want %d all ok\n%s", v, errs[i], len(evs), failed, sessions, outs[i])
		}
		if !strings.Contains(string(outs[i]), `"version":"`+v+`.`) {
			t.Fatalf("the %s client did not run playwright-core %s:\n%s", v, v, outs[i])
		}
	}

	mu.Lock()
	defer mu.Unlock()
	for _, v := range versions {
		total, retired := 0, 0
		for id, lt := range seen[v] {
			total += lt - base[v][id]
			if lt == maxLifetime {
				retired++
			}
		}
		ids := make([]string, 0, len(seen[v]))
		for id := range seen[v] {
			ids = append(ids, fmt.Sprintf("%s:%d", id, seen[v][id]))
		}
		sort.Strings(ids)
		t.Logf("Playwright %s: %d sessions, all ok; its workers' lifetimes add up to %d; %d retired; most draining at once %d; %v",
			v, sessions, total, retired, maxDraining[v], ids)
		if total != sessions {
			t.Errorf("the lifetimes of the %s workers add up to %d, want its %d sessions", v, total, sessions)
		}
		if maxDraining[v] > 1 {
			t.Errorf("%d workers of %s were draining at once, want at most 1", maxDraining[v], v)
		}
		if retired < 1 {
			t.Errorf("no %s worker reached max_lifetime %d: recycling was not exercised", v, maxLifetime)
		}
	}
}

// httpsClient trusts only the grid's CA and keeps its connection.
func httpsClient(t *testing.T, g *Grid) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(g.RootCA())
	if err != nil {
		t.Fatalf("reading Caddy's root CA: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: false}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// upgrade sends a WebSocket upgrade to a wss:// URL and returns the status
// and body (an upgraded connection is closed at once).
func upgrade(t *testing.T, hc *http.Client, wss, ua string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+strings.TrimPrefix(wss, "wss://"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("User-Agent", ua)
	if ua == "" {
		req.Header["User-Agent"] = nil // Go's client sends none then
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("upgrade request: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return resp.StatusCode, ""
	}
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestAWaiterOfAnotherVersionIsNotHeldBehindTheHead: one worker of each
// Playwright version, one session at a time each, both taken. A 1.64
// client waits first, then a 1.65 client. When the 1.65 worker's session
// ends, the 1.65 client is served at once, though the 1.64 client ahead
// of it still waits.
func TestAWaiterOfAnotherVersionIsNotHeldBehindTheHead(t *testing.T) {
	g := startGrid(t, Config{Workers: 2, MaxConcurrent: 1, MaxLifetime: 100, PlaywrightVersions: []string{"1.64", "1.65"}})
	ctx := context.Background()
	testenv.Eventually(t, 90*time.Second, "a worker of each version", func() bool {
		p, err := g.PoolStatus(ctx, "chromium")
		return err == nil && len(p.Versions) == 2 && p.Available == 2
	})
	type held struct {
		stdin  io.WriteCloser
		events chan sessionEvent
	}
	hold := func(version string) held {
		t.Helper()
		cmd := client(t, g, "hold", "--url", g.URL(), "--playwright-version", version, "--timeout", "60000")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		evs := make(chan sessionEvent, 4)
		go func() {
			dec := json.NewDecoder(out)
			for {
				var ev sessionEvent
				if dec.Decode(&ev) != nil {
					close(evs)
					return
				}
				evs <- ev
			}
		}()
		return held{stdin, evs}
	}
	ready := func(h held, within time.Duration, what string) {
		t.Helper()
		select {
		case ev := <-h.events:
			if ev.Event != "ready" {
				t.Fatalf("%s: %+v, want its session open", what, ev)
			}
		case <-time.After(within):
			t.Fatalf("%s: no session within %s", what, within)
		}
	}
	h64, h65 := hold("1.64"), hold("1.65")
	ready(h64, 60*time.Second, "the 1.64 worker's first client")
	ready(h65, 60*time.Second, "the 1.65 worker's first client")
	w64 := hold("1.64")
	testenv.Eventually(t, 10*time.Second, "the 1.64 client waits", func() bool {
		p, err := g.PoolStatus(ctx, "chromium")
		return err == nil && p.QueueDepth == 1
	})
	w65 := hold("1.65")
	testenv.Eventually(t, 10*time.Second, "the 1.65 client waits behind it", func() bool {
		p, err := g.PoolStatus(ctx, "chromium")
		return err == nil && p.QueueDepth == 2
	})
	start := time.Now()
	h65.stdin.Close() // the 1.65 worker's session ends
	ready(w65, 5*time.Second, "the waiting 1.65 client, behind a 1.64 one")
	t.Logf("the 1.65 client was served %s after the 1.65 slot freed; the 1.64 client still waits", time.Since(start).Round(time.Millisecond))
	select {
	case ev := <-w64.events:
		t.Fatalf("the 1.64 client, whose worker is still taken: %+v", ev)
	default:
	}
}
