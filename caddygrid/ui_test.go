package caddygrid_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// uiShown is what playwright/grid-ui-check.mjs read off the page.
type uiShown struct {
	OK        bool     `json:"ok"`
	Error     string   `json:"error"`
	Failed    []string `json:"failed"`
	SampledAt int64    `json:"sampled_at"`
	Status    string   `json:"status"`
	Pools     []struct {
		Pool    string            `json:"pool"`
		Figures map[string]string `json:"figures"`
		Workers []struct {
			ID, Status, Lifetime, Active, Playwright, Heartbeat string
		} `json:"workers"`
		SawtoothLines int `json:"sawtooth_lines"`
		RestartMarks  int `json:"restart_marks"`
	} `json:"pools"`
}

// TestGridUIWithPlaywright drives sessions through a real bin/caddy whose
// fakebrowser workers are restarted (registered anew) when they reach
// max_lifetime, as grid-worker does, then loads the browser_grid_ui page
// in headless Chromium behind basic_auth and checks that it shows every
// worker with the lifetime and live sessions the admin API reports at
// the same moment, the pool's capacity, and the restarts in the sawtooth.
// The screenshot goes to a temporary directory, or, with
// UPDATE_SCREENSHOT=1, to docs/img/grid-ui.png.
func TestGridUIWithPlaywright(t *testing.T) {
	node := testenv.LookPath(t, "node")
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		testenv.Missing(t, "/usr/bin/chromium not installed")
	}
	root := testenv.RepoRoot(t)
	script := filepath.Join(root, "playwright", "grid-ui-check.mjs")
	if _, err := os.Stat(filepath.Join(root, "playwright", "node_modules", "playwright-core")); err != nil {
		testenv.Missing(t, "playwright-core not installed in playwright/ (run 'make deps')")
	}
	const password = "page-secret-7f3a"
	out, err := exec.Command(caddyBin(t), "hash-password", "--plaintext", password, "--bcrypt-cost", "10").Output()
	if err != nil {
		t.Fatalf("caddy hash-password: %v", err)
	}
	hash := strings.TrimSpace(string(out))

	g := newGrid(t)
	ids := []string{"w1", "w2", "w3"}
	for _, id := range ids {
		g.worker("chromium", id, fake.Behavior{})
	}
	const maxLifetime = 4
	opts := caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	handle_path /grid-ui/* {
		basic_auth {
			operator %s
		}
		browser_grid_ui {
			interval 1s
		}
	}
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 2
			max_lifetime %d
		}
	}`, hash, maxLifetime)}
	c := startCaddy(t, opts)
	page := "http://" + c.addr() + "/grid-ui/"

	get := func(method, path string, auth bool) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+c.addr()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth {
			req.SetBasicAuth("operator", password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	sampledAt := func() int64 {
		t.Helper()
		code, body := get(http.MethodGet, "/grid-ui/data.json", true)
		if code != http.StatusOK {
			t.Fatalf("GET data.json: %d %s", code, body)
		}
		var d struct {
			SampledAt int64 `json:"sampled_at"`
		}
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatalf("data.json: %v\n%s", err, body)
		}
		return d.SampledAt
	}

	// Odd requests: no credentials, unknown paths, other methods.
	for _, tc := range []struct {
		method, path string
		auth         bool
		want         int
	}{
		{http.MethodGet, "/grid-ui/", false, http.StatusUnauthorized},
		{http.MethodGet, "/grid-ui/data.json", false, http.StatusUnauthorized},
		{http.MethodGet, "/grid-ui/", true, http.StatusOK},
		{http.MethodHead, "/grid-ui/data.json", true, http.StatusOK},
		{http.MethodGet, "/grid-ui/app.js", true, http.StatusOK},
		{http.MethodGet, "/grid-ui/nope", true, http.StatusNotFound},
		{http.MethodGet, "/grid-ui/ui/index.html", true, http.StatusNotFound},
		{http.MethodGet, "/grid-ui/data.json/x", true, http.StatusNotFound},
		{http.MethodPost, "/grid-ui/data.json", true, http.StatusMethodNotAllowed},
		{http.MethodDelete, "/grid-ui/", true, http.StatusMethodNotAllowed},
	} {
		if code, body := get(tc.method, tc.path, tc.auth); code != tc.want {
			t.Errorf("%s %s (credentials %v): %d, want %d\n%s", tc.method, tc.path, tc.auth, code, tc.want, body)
		}
	}

	// Traffic: one to three sessions, one after the other, per sample; a
	// worker at max_lifetime with nothing live is registered anew (a new
	// browser) at once, as its agent would (while a worker retires, the
	// staggered drains hold the others back).
	restarts := 0
	for round := 0; round < 16; round++ {
		for i := 0; i <= round%3; i++ {
			mustDial(t, c.url("/playwright/chromium")).close()
			testenv.Eventually(t, 20*time.Second, "the session released", func() bool {
				for _, id := range ids {
					if g.info("chromium", id).Active != 0 {
						return false
					}
				}
				return true
			})
			for _, id := range ids {
				if w := g.info("chromium", id); w.Lifetime >= maxLifetime {
					err := g.reg.Register(context.Background(), registry.Registration{
						Pool: "chromium", ID: id, BrowserType: "chromium", Addr: w.Addr, Path: w.Path,
						TTL: workerTTL, Generation: registry.NewGeneration(),
					})
					if err != nil {
						t.Fatalf("registering %s anew: %v", id, err)
					}
					restarts++
				}
			}
		}
		before := sampledAt()
		testenv.Eventually(t, 20*time.Second, "the page's next sample", func() bool { return sampledAt() > before })
	}
	if restarts == 0 {
		t.Fatal("no worker reached max_lifetime: the traffic did not make a sawtooth")
	}

	// A session stays live while the page is read.
	live := mustDial(t, c.url("/playwright/chromium"))
	defer live.close()

	var shown uiShown
	var detail caddygrid.PoolDetail
	var mismatch string
	screenshot := filepath.Join(t.TempDir(), "grid-ui.png")
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		screenshot = filepath.Join(root, "docs", "img", "grid-ui.png")
		if err := os.MkdirAll(filepath.Dir(screenshot), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for attempt := 1; ; attempt++ {
		// The admin API now, then the page once it shows a later sample.
		at := time.Now().UnixMilli()
		code, body := c.admin(http.MethodGet, "/grid/pools/chromium")
		if code != http.StatusOK {
			t.Fatalf("GET /grid/pools/chromium: %d %s", code, body)
		}
		detail = caddygrid.PoolDetail{}
		if err := json.Unmarshal(body, &detail); err != nil {
			t.Fatalf("admin API: %v\n%s", err, body)
		}
		cmd := exec.Command(node, script, "--url", page, "--user", "operator", "--password", password,
			"--after", strconv.FormatInt(at, 10), "--screenshot", screenshot, "--timeout", "30000")
		cmd.Dir = filepath.Join(root, "playwright")
		out, _ := cmd.Output()
		shown = uiShown{}
		if err := json.Unmarshal(out, &shown); err != nil || !shown.OK {
			t.Fatalf("the page check printed %q (%v)", out, err)
		}
		// The Playwright version, read by name: the worker status carries
		// it when the worker reports one (none of these fakebrowsers do).
		var versions struct {
			Workers []struct {
				ID                string `json:"id"`
				PlaywrightVersion string `json:"playwright_version"`
			} `json:"workers"`
		}
		if err := json.Unmarshal(body, &versions); err != nil {
			t.Fatalf("admin API: %v\n%s", err, body)
		}
		pw := map[string]string{}
		for _, w := range versions.Workers {
			pw[w.ID] = w.PlaywrightVersion
		}
		mismatch = compareUI(shown, detail, pw, maxLifetime)
		if mismatch == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never agreed with the admin API: %s\npage: %+v\nadmin: %s", mismatch, shown, body)
		}
		t.Logf("attempt %d: %s; reading again", attempt, mismatch)
	}
	if len(shown.Failed) > 0 {
		t.Errorf("the page had failed requests or errors: %v", shown.Failed)
	}
	p := shown.Pools[0]
	if p.SawtoothLines != len(ids) {
		t.Errorf("the sawtooth draws %d lines, want one per worker (%d)", p.SawtoothLines, len(ids))
	}
	if p.RestartMarks == 0 {
		t.Errorf("the sawtooth marks no restart; the test registered workers anew %d times", restarts)
	}
	if p.Figures["drains"] == "0" {
		t.Errorf("the page counts no drains; the test registered workers anew %d times", restarts)
	}
	t.Logf("page agrees with the admin API: %d workers, active %d, capacity %d, %d restarts marked, drains %s, sessions/s %s; screenshot %s",
		len(p.Workers), detail.Active, detail.Capacity, p.RestartMarks, p.Figures["drains"], p.Figures["sessions_per_sec"], screenshot)

	// A reload keeps the sampler and its history.
	history := func() (sampled, first int64) {
		_, body := get(http.MethodGet, "/grid-ui/data.json", true)
		var d struct {
			SampledAt int64 `json:"sampled_at"`
			Pools     []struct {
				Series struct {
					T []int64 `json:"t"`
				} `json:"series"`
			} `json:"pools"`
		}
		if err := json.Unmarshal([]byte(body), &d); err != nil || len(d.Pools) != 1 || len(d.Pools[0].Series.T) == 0 {
			t.Fatalf("data.json without the pool's history (%v):\n%s", err, body)
		}
		return d.SampledAt, d.Pools[0].Series.T[0]
	}
	_, first := history()
	c.reload(opts)
	reloaded := time.Now().UnixMilli()
	testenv.Eventually(t, 20*time.Second, "a sample after the reload", func() bool {
		sampled, _ := history()
		return sampled > reloaded
	})
	if _, got := history(); got != first {
		t.Errorf("after a reload the history begins at %d, want %d (the sampler's history is kept)", got, first)
	}

	// No secrets on the page or in its data.
	for _, path := range []string{"/grid-ui/", "/grid-ui/data.json", "/grid-ui/app.js"} {
		_, body := get(http.MethodGet, path, true)
		for _, secret := range []string{password, hash, g.redis.URL()} {
			if strings.Contains(body, secret) {
				t.Errorf("%s shows the secret %q", path, secret)
			}
		}
	}
}

// compareUI says how the page differs from the admin API's pool, or "".
func compareUI(shown uiShown, d caddygrid.PoolDetail, playwright map[string]string, maxLifetime int) string {
	if len(shown.Pools) != 1 || shown.Pools[0].Pool != d.Pool {
		return fmt.Sprintf("the page shows %d pools, want just %q", len(shown.Pools), d.Pool)
	}
	p := shown.Pools[0]
	for key, want := range map[string]int{
		// The pool's JSON "workers" is the list (it hides PoolSummary's
		// count).
		"workers": len(d.WorkerStatuses), "available": d.Available, "draining": d.Draining,
		"active": d.Active, "capacity": d.Capacity, "max_lifetime": maxLifetime,
	} {
		if got := p.Figures[key]; got != strconv.Itoa(want) {
			return fmt.Sprintf("the pool's %s shows %q, the admin API says %d", key, got, want)
		}
	}
	if len(p.Workers) != len(d.WorkerStatuses) {
		return fmt.Sprintf("%d workers on the page, %d in the admin API", len(p.Workers), len(d.WorkerStatuses))
	}
	byID := map[string]caddygrid.WorkerStatus{}
	for _, w := range d.WorkerStatuses {
		byID[w.ID] = w
	}
	for _, w := range p.Workers {
		a, ok := byID[w.ID]
		if !ok {
			return fmt.Sprintf("worker %q on the page is not in the admin API", w.ID)
		}
		if want := fmt.Sprintf("%d / %d", a.Lifetime, maxLifetime); w.Lifetime != want {
			return fmt.Sprintf("worker %s's lifetime shows %q, the admin API says %q", w.ID, w.Lifetime, want)
		}
		if want := fmt.Sprintf("%d / %d", a.Active, d.MaxConcurrent); w.Active != want {
			return fmt.Sprintf("worker %s's active shows %q, the admin API says %q", w.ID, w.Active, want)
		}
		if !strings.HasPrefix(w.Status, a.Status) {
			return fmt.Sprintf("worker %s's status shows %q, the admin API says %q", w.ID, w.Status, a.Status)
		}
		if w.Playwright != playwright[w.ID] {
			return fmt.Sprintf("worker %s's Playwright version shows %q, the admin API says %q", w.ID, w.Playwright, playwright[w.ID])
		}
		if w.Heartbeat == "" {
			return fmt.Sprintf("worker %s shows no heartbeat age", w.ID)
		}
	}
	return ""
}
