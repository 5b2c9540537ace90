package caddygrid_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// uiShown is what playwright/grid-ui-check.mjs read off the page.
type uiShown struct {
	OK        bool     `json:"ok"`
	Error     string   `json:"error"`
	Failed    []string `json:"failed"`
	SampledAt int64    `json:"sampled_at"`
	Pools     []struct {
		Pool    string            `json:"pool"`
		Figures map[string]string `json:"figures"`
		Workers []struct {
			ID, Status, Lifetime, Active, Playwright, Heartbeat string
		} `json:"workers"`
		Sessions []struct {
			ID, Label, Worker, State string
		} `json:"sessions"`
		SawtoothLines int      `json:"sawtooth_lines"`
		LeftMarks     int      `json:"left_marks"`
		Legend        []string `json:"legend"`
	} `json:"pools"`
}

// TestGridPageShowsWhatTheAdminAPIReports: workers recycle (max_lifetime
// 3, agents with -respawn) under sessions through a real bin/caddy, then
// headless Chromium loads the browser_grid_ui page behind basic_auth. The
// page lists every registered worker with the lifetime, live sessions and
// status the admin API reports at the same moment, lists the live session
// with its label, draws one lifetime line per worker it saw, ends the
// lines of the workers that left with a dot, and names in its legend only
// the workers still registered. The screenshot goes to a temporary
// directory, or, with UPDATE_SCREENSHOT=1, to docs/img/grid-ui.png.
func TestGridPageShowsWhatTheAdminAPIReports(t *testing.T) {
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
	out, err := exec.Command(testenv.Bin(t, "caddy"), "hash-password", "--plaintext", password, "--bcrypt-cost", "4").Output()
	if err != nil {
		t.Fatalf("caddy hash-password: %v", err)
	}
	hash := strings.TrimSpace(string(out))

	g := newGrid(t)
	for range 2 {
		g.agent("chromium", func(c *workeragent.Config) { c.Respawn = true })
	}
	const maxLifetime = 3
	opts := caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	handle_path /grid-ui/* {
		basic_auth {
			operator %s
		}
		browser_grid_ui {
			interval 500ms
		}
	}
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 2
			max_lifetime %d
		}
	}`, hash, maxLifetime)}
	c := startCaddy(t, opts)
	page := c.httpURL("/grid-ui/")

	get := func(method, path string, auth bool) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, c.httpURL(path), nil)
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

	sampledAt := func() int64 {
		t.Helper()
		code, body := get(http.MethodGet, "/grid-ui/data.json", true)
		var d struct {
			SampledAt int64 `json:"sampled_at"`
		}
		if err := json.Unmarshal([]byte(body), &d); code != http.StatusOK || err != nil {
			t.Fatalf("GET data.json: %d %v\n%s", code, err, body)
		}
		return d.SampledAt
	}

	// Sessions one after the other, each seen by the page's sampler,
	// until two workers have left: each agent's browser serves 3, then
	// its replacement takes over.
	seen := map[string]bool{}
	testenv.Eventually(t, 60*time.Second, "two workers replaced", func() bool {
		mustDial(t, c.url("/playwright/chromium")).close()
		after := time.Now().UnixMilli()
		testenv.Eventually(t, 10*time.Second, "the page's next sample", func() bool { return sampledAt() > after })
		live := map[string]bool{}
		for _, w := range g.workers("chromium") {
			seen[w.ID], live[w.ID] = true, true
		}
		gone := 0
		for id := range seen {
			if !live[id] {
				gone++
			}
		}
		return gone >= 2
	})
	time.Sleep(time.Second) // two samples past the last change

	// A session stays live, labelled, while the page is read.
	h := http.Header{}
	h.Set(caddygrid.HeaderLabel, "checkout flow")
	live, err := dialHeader(t.Context(), c.url("/playwright/chromium"), h)
	if err != nil {
		t.Fatal(err)
	}
	defer live.close()

	screenshot := filepath.Join(t.TempDir(), "grid-ui.png")
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		screenshot = filepath.Join(root, "docs", "img", "grid-ui.png")
	}
	var shown uiShown
	var detail caddygrid.PoolDetail
	var mismatch string
	deadline := time.Now().Add(60 * time.Second)
	for attempt := 1; ; attempt++ {
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
		mismatch = compareUI(shown, detail, maxLifetime)
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
	if len(p.Sessions) != 1 || p.Sessions[0].Label != "checkout flow" || p.Sessions[0].ID != live.resp.Header.Get("Grid-Session") {
		t.Errorf("the page lists sessions %+v, want the one live session %s labelled \"checkout flow\"", p.Sessions, live.resp.Header.Get("Grid-Session"))
	}
	gone := len(seen) - len(detail.Workers)
	if p.SawtoothLines < len(detail.Workers)+2 || p.LeftMarks < 2 {
		t.Errorf("the lifetime chart draws %d lines with %d end dots; %d workers registered and %d gone", p.SawtoothLines, p.LeftMarks, len(detail.Workers), gone)
	}
	var registered []string
	for _, w := range detail.Workers {
		registered = append(registered, w.ID)
	}
	for _, name := range p.Legend {
		if !slices.Contains(registered, name) {
			t.Errorf("the legend names %q, which is not registered (%v)", name, registered)
		}
	}
	if p.Figures["drains"] == "0" {
		t.Errorf("the page counts no drains; %d workers left", gone)
	}
	t.Logf("page agrees with the admin API: %d workers, %d gone, active %d, %d lines, %d end dots; screenshot %s",
		len(p.Workers), gone, detail.Active, p.SawtoothLines, p.LeftMarks, screenshot)

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
func compareUI(shown uiShown, d caddygrid.PoolDetail, maxLifetime int) string {
	if len(shown.Pools) != 1 || shown.Pools[0].Pool != d.Pool {
		return fmt.Sprintf("the page shows %d pools, want just %q", len(shown.Pools), d.Pool)
	}
	p := shown.Pools[0]
	for key, want := range map[string]int{
		"workers": len(d.Workers), "available": d.Available, "leaving": d.Leaving,
		"active": d.Active, "capacity": d.Capacity, "max_lifetime": maxLifetime,
	} {
		if got := p.Figures[key]; got != strconv.Itoa(want) {
			return fmt.Sprintf("the pool's %s shows %q, the admin API says %d", key, got, want)
		}
	}
	if len(p.Workers) != len(d.Workers) {
		return fmt.Sprintf("%d workers on the page, %d in the admin API", len(p.Workers), len(d.Workers))
	}
	byID := map[string]caddygrid.WorkerStatus{}
	for _, w := range d.Workers {
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
		if !strings.HasPrefix(w.Active, strconv.Itoa(a.Active)+" ") {
			return fmt.Sprintf("worker %s's active shows %q, the admin API says %d", w.ID, w.Active, a.Active)
		}
		if !strings.HasPrefix(w.Status, a.Status) {
			return fmt.Sprintf("worker %s's status shows %q, the admin API says %q", w.ID, w.Status, a.Status)
		}
		if w.Heartbeat == "" {
			return fmt.Sprintf("worker %s shows no heartbeat age", w.ID)
		}
	}
	return ""
}
