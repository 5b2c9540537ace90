package main

// The first-page section: what a Playwright user waits for, from the
// connect to a page holding its content, through real Chromium, for both
// launchers: the shared browser (playwright: Playwright's browser server)
// and a browser per session (playwright-server: Playwright's run-server,
// which launches one per connection), each through the grid and dialled
// directly at the browser server the agent fronts, and per session with
// Chromium flags (the same flags every session, so after the first the
// launcher's browser server for them is there; and new flags every
// session, which start one each). The client is
// playwright/client.mjs (node, playwright-core), one session at a time,
// the paths taking turns.
//
//	gridbench -only first-page          # about 1 min
//	gridbench -only first-page -quick   # a smoke run

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func init() {
	register(section{name: "first-page", order: 60, run: runFirstPage})
}

func runFirstPage(cfg *config) error {
	out := cfg.out
	rounds, per := 6, 5
	if cfg.quick {
		rounds, per = 1, 2
	}
	script, err := clientScript()
	if err != nil {
		return err
	}
	w, err := newWorld()
	if err != nil {
		return err
	}
	defer w.close()
	if err := w.startAgents(1, "shared", "--launcher", "playwright", "--max-concurrent", "2"); err != nil {
		return err
	}
	if err := w.startAgents(1, "fresh", "--launcher", "playwright-server", "--max-concurrent", "2", "--id-prefix", "fresh"); err != nil {
		return err
	}
	c, err := w.startCaddy("caddy", 2, func(addrs []string) string {
		return gridSite(addrs[0], "shared", "") + gridSite(addrs[1], "fresh", "\t\tlaunch_args --accept-lang\n")
	})
	if err != nil {
		return err
	}
	backend := func(pool string) (string, error) {
		ws, err := w.available(pool)
		if err != nil || len(ws) == 0 {
			return "", fmt.Errorf("no %s worker: %v", pool, err)
		}
		b, err := browserAddr(ws[0].Addr, ws[0].ID)
		return "ws://" + b + ws[0].Path, err
	}
	sharedDirect, err := backend("shared")
	if err != nil {
		return err
	}
	freshDirect, err := backend("fresh")
	if err != nil {
		return err
	}
	fresh := "ws://" + c.sites[1] + "/playwright/fresh"
	n := 0
	paths := []struct {
		name, url string
		// opts are the launch options of the path's sessions ("" none);
		// newOpts, when set, gives each session options of its own.
		opts    string
		newOpts func() string
	}{
		{"shared browser, through the grid", "ws://" + c.sites[0] + "/playwright/shared", "", nil},
		{"shared browser, direct", sharedDirect, "", nil},
		{"a browser per session, through the grid", fresh, "", nil},
		{"a browser per session, direct", freshDirect, "", nil},
		{"a browser per session with flags, through the grid", fresh, `{"args":["--accept-lang=de"]}`, nil},
		{"a browser per session with new flags each, through the grid", fresh, "", func() string { n++; return fmt.Sprintf(`{"args":["--accept-lang=x%d"]}`, n) }},
	}
	run := func(j, sessions int) ([]time.Duration, error) {
		p := paths[j]
		if p.newOpts == nil {
			return firstPages(script, p.url, p.opts, sessions)
		}
		var ds []time.Duration
		for range sessions {
			d, err := firstPages(script, p.url, p.newOpts(), 1)
			if err != nil {
				return nil, err
			}
			ds = append(ds, d...)
		}
		return ds, nil
	}
	times := make([][]time.Duration, len(paths))
	for j := range paths { // warm up: node, the caches, the first browser
		if _, err := run(j, 1); err != nil {
			return fmt.Errorf("%s: %w", paths[j].name, err)
		}
	}
	for r := range rounds {
		for k := range paths {
			j := (r + k) % len(paths)
			ds, err := run(j, per)
			if err != nil {
				return fmt.Errorf("%s: %w", paths[j].name, err)
			}
			times[j] = append(times[j], ds...)
		}
	}
	p50 := func(j int) float64 { return float64(quantile(times[j], 0.5)) }
	fmt.Fprintf(out, "Real Chromium behind one agent of each launcher; %d rounds of %d sessions per path, one at a time, the paths taking turns.\n\n", rounds, per)
	var rows [][]string
	for j, p := range paths {
		rows = append(rows, []string{p.name, ms(quantile(times[j], 0.5)), ms(quantile(times[j], 0.9))})
	}
	table(out, []string{"path", "connect to a first page, p50 (ms)", "p90 (ms)"}, rows...)
	goals(out,
		goal{"shared browser through the grid", ms(quantile(times[0], 0.5)) + " ms", "direct " + ms(quantile(times[1], 0.5)) + " ms",
			ratio(p50(0), p50(1)), "≤ 1.15× direct", p50(0) <= 1.15*p50(1)},
		goal{"a browser per session through the grid", ms(quantile(times[2], 0.5)) + " ms", "shared browser through the grid " + ms(quantile(times[0], 0.5)) + " ms",
			ratio(p50(2), p50(0)), "≤ 2× the shared browser", p50(2) <= 2*p50(0)},
	)
	return nil
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 0, 64) }

// clientScript is playwright/client.mjs beside the binaries.
func clientScript() (string, error) {
	bin, err := findBin("caddy")
	if err != nil {
		return "", err
	}
	s := filepath.Join(filepath.Dir(bin), "..", "playwright", "client.mjs")
	if _, err := os.Stat(filepath.Join(filepath.Dir(s), "node_modules", "playwright-core")); err != nil {
		return "", fmt.Errorf("playwright-core not installed beside %s (make deps)", s)
	}
	return s, nil
}

// firstPages runs n sessions at url, one at a time, with the launch
// options opts ("" none), and returns each one's time from the connect
// to a first page.
func firstPages(script, url, opts string, n int) ([]time.Duration, error) {
	args := []string{script, "run", "--url", url, "--sessions", strconv.Itoa(n), "--timeout", "30000"}
	if opts != "" {
		args = append(args, "--header", "x-playwright-launch-options: "+opts)
	}
	cmd := exec.Command("node", args...)
	out, err := cmd.CombinedOutput()
	var ds []time.Duration
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var ev struct {
			Event       string `json:"event"`
			OK          bool   `json:"ok"`
			FirstPageMs int64  `json:"firstPageMs"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event == "session" && ev.OK {
			ds = append(ds, time.Duration(ev.FirstPageMs)*time.Millisecond)
		}
	}
	if err != nil || len(ds) != n {
		return nil, fmt.Errorf("%d of %d sessions (%v):\n%s", len(ds), n, err, out)
	}
	return ds, nil
}
