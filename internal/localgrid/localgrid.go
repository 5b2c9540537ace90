// Package localgrid starts a whole grid on one machine from the project's
// real parts: a redis-server with its data in a temp dir, grid-worker
// processes each running a browser server, and bin/caddy serving wss://
// with its internal CA. `make run` (cmd/griddemo) and the end-to-end tests
// use it, so what a newcomer sees is what the tests prove.
//
// Every process runs in its own process group and Stop ends each group, so
// nothing is left behind: no Redis, no worker, no Chromium.
package localgrid

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"
)

// Config describes the grid to start. Zero values take the defaults shown.
type Config struct {
	// Dir holds every file of the grid (Redis data, Caddy storage, logs).
	// Default: a new temp dir, removed by Stop.
	Dir string
	// BinDir holds caddy and grid-worker. Default: "bin".
	BinDir string
	// PlaywrightDir holds node_modules with playwright-core. Default: "playwright".
	PlaywrightDir string
	// Ports. 0 picks a free port.
	RedisPort, HTTPSPort, HTTPPort, AdminPort int
	// Workers is how many grid-worker processes run. Default: 3.
	Workers int
	// Launcher of every worker: playwright, cdp, exec or fake. Default: playwright.
	Launcher string
	// Pool served at /playwright/<pool> (and /cdp/<pool> for cdp). Default: chromium.
	Pool string
	// Policy of the browser_grid handler. Default: lifetime_first.
	Policy string
	// MaxConcurrent and MaxLifetime of the pool. Defaults: 2 and 10.
	MaxConcurrent, MaxLifetime int
	// SelectTimeout of the handler. Default: 60s.
	SelectTimeout time.Duration
	// LaunchArgs are the handler's launch_args, on both routes. Default: none.
	LaunchArgs []string
	// HeartbeatInterval and DrainTimeout of the workers. Defaults: 1s and 30s.
	HeartbeatInterval, DrainTimeout time.Duration
	// StaleThreshold of Caddy's grid option, given to the workers too.
	// Default: 10s.
	StaleThreshold time.Duration
	// WorkerArgs are appended to every grid-worker command line.
	WorkerArgs []string
	// PlaywrightVersions, when set, are the playwright-core versions
	// (major.minor) the playwright launchers load, taken in turn: worker i
	// gets PlaywrightVersions[(i-1) % len]. Default: none (the newest
	// installed for every worker).
	PlaywrightVersions []string
	// Log receives a line for each step. Default: discarded.
	Log io.Writer
}

// Grid is a running local grid.
type Grid struct {
	cfg     Config
	ownDir  bool
	mu      sync.Mutex
	procs   []*proc
	stopped bool

	// uiPassword is the grid page's password (user UIUser), uiHash its
	// bcrypt hash in the Caddyfile.
	uiPassword, uiHash string
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// PortInUseError says which port of the grid is taken.
type PortInUseError struct {
	What string
	Port int
	Var  string
}

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("port %d (%s) is already in use; choose another with %s=<port>", e.Port, e.What, e.Var)
}

func (c *Config) setDefaults() {
	if c.BinDir == "" {
		c.BinDir = "bin"
	}
	if c.PlaywrightDir == "" {
		c.PlaywrightDir = "playwright"
	}
	if c.Workers == 0 {
		c.Workers = 3
	}
	if c.Launcher == "" {
		c.Launcher = "playwright"
	}
	if c.Pool == "" {
		c.Pool = "chromium"
	}
	if c.Policy == "" {
		c.Policy = "lifetime_first"
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 2
	}
	if c.MaxLifetime == 0 {
		c.MaxLifetime = 10
	}
	if c.SelectTimeout == 0 {
		c.SelectTimeout = 60 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.StaleThreshold == 0 {
		c.StaleThreshold = 10 * time.Second
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
}

// checkPort returns a free port for 0, or checks that a chosen one is
// free. It returns the listener holding the port: the caller closes it once
// every port of the grid is chosen, so that the kernel cannot hand the same
// free port out twice (it may once a listener is closed).
func checkPort(port *int, what, envVar string) (net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(*port))
	if err != nil {
		return nil, &PortInUseError{What: what, Port: *port, Var: envVar}
	}
	*port = l.Addr().(*net.TCPAddr).Port
	return l, nil
}

// Start starts Redis, Caddy and the workers, and waits until every worker
// has registered. On error everything started so far is stopped.
func Start(ctx context.Context, cfg Config) (g *Grid, err error) {
	cfg.setDefaults()
	g = &Grid{cfg: cfg}
	defer func() {
		if err != nil {
			g.Stop()
		}
	}()
	var held []net.Listener
	for _, p := range []struct {
		port     *int
		what, ev string
	}{
		{&g.cfg.RedisPort, "redis", "REDIS_PORT"},
		{&g.cfg.HTTPSPort, "caddy https", "HTTPS_PORT"},
		{&g.cfg.HTTPPort, "caddy http", "HTTP_PORT"},
		{&g.cfg.AdminPort, "caddy admin", "ADMIN_PORT"},
	} {
		l, err := checkPort(p.port, p.what, p.ev)
		if err != nil {
			for _, l := range held {
				l.Close()
			}
			return g, err
		}
		held = append(held, l)
	}
	for _, l := range held {
		l.Close()
	}
	if g.cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "browser-grid-")
		if err != nil {
			return g, fmt.Errorf("creating the grid's temp dir: %w", err)
		}
		g.cfg.Dir, g.ownDir = dir, true
	}
	for _, bin := range []string{"caddy", "grid-worker"} {
		if _, err := os.Stat(filepath.Join(g.cfg.BinDir, bin)); err != nil {
			return g, fmt.Errorf("%s not found in %s: run 'make build' first", bin, g.cfg.BinDir)
		}
	}

	// Redis, with its data in the grid's dir.
	redisDir := filepath.Join(g.cfg.Dir, "redis")
	if err := os.MkdirAll(redisDir, 0o755); err != nil {
		return g, err
	}
	if _, err := g.start("redis", nil, "redis-server", "--port", strconv.Itoa(g.cfg.RedisPort),
		"--bind", "127.0.0.1", "--dir", redisDir, "--save", "", "--appendonly", "no"); err != nil {
		return g, err
	}
	if err := waitTCP(ctx, g.RedisAddr()); err != nil {
		return g, fmt.Errorf("redis did not start: %w (log: %s)", err, g.LogPath("redis"))
	}
	g.logf("redis      %s (data in %s)", g.RedisAddr(), redisDir)

	// Caddy.
	abs, _ := filepath.Abs(filepath.Join(g.cfg.BinDir, "caddy"))
	if err := g.pagePassword(abs); err != nil {
		return g, err
	}
	caddyfile := filepath.Join(g.cfg.Dir, "Caddyfile")
	if err := os.WriteFile(caddyfile, g.Caddyfile(), 0o644); err != nil {
		return g, err
	}
	if _, err := g.start("caddy", []string{"XDG_DATA_HOME=" + filepath.Join(g.cfg.Dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(g.cfg.Dir, "config")},
		abs, "run", "--config", caddyfile, "--adapter", "caddyfile"); err != nil {
		return g, err
	}
	if err := waitTCP(ctx, "127.0.0.1:"+strconv.Itoa(g.cfg.HTTPSPort)); err != nil {
		return g, fmt.Errorf("caddy did not start: %w (log: %s)", err, g.LogPath("caddy"))
	}
	g.logf("caddy      %s (admin http://127.0.0.1:%d, Caddyfile %s)", g.URL(), g.cfg.AdminPort, caddyfile)
	g.logf("page       %s (user %s, password %s)", g.UIURL(), UIUser, g.uiPassword)

	// Workers.
	for i := 1; i <= g.cfg.Workers; i++ {
		if err := g.StartWorker(i); err != nil {
			return g, err
		}
	}
	if err := g.WaitWorkers(ctx, g.cfg.Workers); err != nil {
		return g, err
	}
	g.logf("workers    %d registered in pool %q", g.cfg.Workers, g.cfg.Pool)
	if _, err := os.Stat(g.RootCA()); err == nil {
		g.logf("root CA    %s", g.RootCA())
	}
	return g, nil
}

// StartWorker starts grid-worker number i.
func (g *Grid) StartWorker(i int) error {
	bin, _ := filepath.Abs(filepath.Join(g.cfg.BinDir, "grid-worker"))
	args := []string{
		"--redis", g.RedisURL(),
		"--pool", g.cfg.Pool,
		"--launcher", g.cfg.Launcher,
		"--max-concurrent", strconv.Itoa(g.cfg.MaxConcurrent),
		"--heartbeat-interval", g.cfg.HeartbeatInterval.String(),
		"--drain-timeout", g.cfg.DrainTimeout.String(),
		// Matches the Caddyfile's stale_threshold, so the agent checks its
		// heartbeat against the threshold Caddy really uses.
		"--stale-threshold", g.cfg.StaleThreshold.String(),
		"--log-format", "console",
		"--respawn",
	}
	args = append(args, g.cfg.WorkerArgs...)
	if n := len(g.cfg.PlaywrightVersions); n > 0 {
		args = append(args, "--playwright-version", g.cfg.PlaywrightVersions[(i-1)%n])
	}
	pw, _ := filepath.Abs(g.cfg.PlaywrightDir)
	_, err := g.start(fmt.Sprintf("worker-%d", i), []string{"GRID_PLAYWRIGHT_DIR=" + pw}, bin, args...)
	return err
}

// Caddyfile is the configuration the grid's Caddy runs.
func (g *Grid) Caddyfile() []byte {
	var b bytes.Buffer
	_ = caddyfileTmpl.Execute(&b, map[string]any{
		"Admin":         g.cfg.AdminPort,
		"HTTP":          g.cfg.HTTPPort,
		"HTTPS":         g.cfg.HTTPSPort,
		"Storage":       filepath.Join(g.cfg.Dir, "caddy"),
		"Redis":         g.RedisURL(),
		"Pool":          g.cfg.Pool,
		"Policy":        g.cfg.Policy,
		"MaxConcurrent": g.cfg.MaxConcurrent,
		"MaxLifetime":   g.cfg.MaxLifetime,
		"SelectTimeout": g.cfg.SelectTimeout.String(),
		"LaunchArgs":    strings.Join(g.cfg.LaunchArgs, " "),
		"Stale":         g.cfg.StaleThreshold.String(),
		"UIUser":        UIUser,
		"UIHash":        g.uiHash,
	})
	return b.Bytes()
}

var caddyfileTmpl = template.Must(template.New("Caddyfile").Parse(`{
	admin 127.0.0.1:{{.Admin}}
	http_port {{.HTTP}}
	https_port {{.HTTPS}}
	local_certs
	skip_install_trust
	storage file_system {{.Storage}}
	grid {
		redis {{.Redis}}
		stale_threshold {{.Stale}}
	}
}

localhost:{{.HTTPS}} {
	redir /grid /grid/
	handle_path /grid/* {
		basic_auth {
			{{.UIUser}} {{.UIHash}}
		}
		browser_grid_ui
	}
	route /playwright/* {
		browser_grid {{.Pool}} {
			policy {{.Policy}}
			max_concurrent {{.MaxConcurrent}}
			max_lifetime {{.MaxLifetime}}
			select_timeout {{.SelectTimeout}}
			{{- if .LaunchArgs}}
			launch_args {{.LaunchArgs}}
			{{- end}}
		}
	}
	route /cdp/* {
		browser_grid {{.Pool}}-cdp {
			policy {{.Policy}}
			max_concurrent {{.MaxConcurrent}}
			max_lifetime {{.MaxLifetime}}
			select_timeout {{.SelectTimeout}}
			{{- if .LaunchArgs}}
			launch_args {{.LaunchArgs}}
			{{- end}}
		}
	}
}
`))

// URL is the wss:// endpoint a Playwright client connects to.
func (g *Grid) URL() string {
	return fmt.Sprintf("wss://localhost:%d/playwright/%s", g.cfg.HTTPSPort, g.cfg.Pool)
}

// UIUser is the user name of the grid page (UIURL).
const UIUser = "operator"

// pagePassword picks a random password for the grid page and hashes it
// with caddy hash-password.
func (g *Grid) pagePassword(caddy string) error {
	var b [9]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("picking the grid page's password: %w", err)
	}
	g.uiPassword = hex.EncodeToString(b[:])
	out, err := exec.Command(caddy, "hash-password", "--plaintext", g.uiPassword, "--bcrypt-cost", "10").Output()
	if err != nil {
		return fmt.Errorf("hashing the grid page's password with %s hash-password: %w", caddy, err)
	}
	g.uiHash = strings.TrimSpace(string(out))
	return nil
}

// UIURL is the grid's live page (browser_grid_ui), behind basic auth as
// UIUser with UIPassword.
func (g *Grid) UIURL() string {
	return fmt.Sprintf("https://localhost:%d/grid/", g.cfg.HTTPSPort)
}

// UIPassword is the grid page's password, new for every Start.
func (g *Grid) UIPassword() string { return g.uiPassword }

// CDPURL is the wss:// endpoint of the pool's CDP workers (pool "<pool>-cdp").
func (g *Grid) CDPURL() string {
	return fmt.Sprintf("wss://localhost:%d/cdp/%s", g.cfg.HTTPSPort, g.cfg.Pool)
}

// RootCA is the path of Caddy's local root certificate.
func (g *Grid) RootCA() string {
	return filepath.Join(g.cfg.Dir, "caddy", "pki", "authorities", "local", "root.crt")
}

// RedisAddr is host:port of the grid's Redis.
func (g *Grid) RedisAddr() string { return "127.0.0.1:" + strconv.Itoa(g.cfg.RedisPort) }

// RedisURL is the redis:// URL of the grid's Redis.
func (g *Grid) RedisURL() string { return "redis://" + g.RedisAddr() + "/0" }

// AdminURL is the base URL of Caddy's admin API.
func (g *Grid) AdminURL() string { return "http://127.0.0.1:" + strconv.Itoa(g.cfg.AdminPort) }

// Dir is the grid's working directory.
func (g *Grid) Dir() string { return g.cfg.Dir }

// LogPath is the log file of a process ("redis", "caddy", "worker-1"…).
func (g *Grid) LogPath(name string) string { return filepath.Join(g.cfg.Dir, "logs", name+".log") }

// Worker is one worker as the admin API reports it.
type Worker struct {
	ID       string `json:"id"`
	Addr     string `json:"addr"`
	Path     string `json:"path"`
	Status   string `json:"status"`
	Active   int    `json:"active"`
	Lifetime int    `json:"lifetime"`
	Capacity int    `json:"capacity"`
	// PlaywrightVersion is the major.minor the worker serves ("": none).
	PlaywrightVersion string `json:"version"`
}

// Pool is a pool as the admin API reports it.
type Pool struct {
	Pool    string   `json:"pool"`
	Workers []Worker `json:"workers"`
	// Versions are the Playwright versions the pool serves.
	Versions []string `json:"versions"`
	// Available counts the workers taking sessions; QueueDepth the
	// requests waiting in the pool's queue.
	Available  int `json:"available"`
	QueueDepth int `json:"queue_depth"`
}

// PoolStatus reads GET /grid/pools/{pool} from Caddy's admin API.
func (g *Grid) PoolStatus(ctx context.Context, pool string) (Pool, error) {
	var p Pool
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.AdminURL()+"/grid/pools/"+pool, nil)
	if err != nil {
		return p, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return p, fmt.Errorf("reading pool %q from the admin API: %w", pool, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return p, fmt.Errorf("admin API answered %s for pool %q: %s", resp.Status, pool, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return p, fmt.Errorf("decoding pool %q: %w", pool, err)
	}
	return p, nil
}

// WaitWorkers waits until at least n workers of the pool are available.
func (g *Grid) WaitWorkers(ctx context.Context, n int) error {
	return g.WaitPool(ctx, g.cfg.Pool, n)
}

// WaitPool waits until at least n workers of pool are available.
func (g *Grid) WaitPool(ctx context.Context, pool string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var last error
	for {
		p, err := g.PoolStatus(ctx, pool)
		if err == nil {
			avail := 0
			for _, w := range p.Workers {
				if w.Status == "available" {
					avail++
				}
			}
			if avail >= n {
				return nil
			}
			last = fmt.Errorf("%d of %d workers available", avail, n)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d workers in pool %q: %v (worker logs in %s)", n, pool, last, filepath.Join(g.cfg.Dir, "logs"))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (g *Grid) logf(format string, args ...any) {
	fmt.Fprintf(g.cfg.Log, format+"\n", args...)
}

// start runs a process in its own process group, its output in a log file.
func (g *Grid) start(name string, env []string, bin string, args ...string) (*proc, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return nil, errors.New("grid stopped")
	}
	if err := os.MkdirAll(filepath.Join(g.cfg.Dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(g.LogPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: f, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	g.procs = append(g.procs, p)
	return p, nil
}

// Stop ends every process of the grid: workers first (so their browsers
// close), then Caddy, then Redis; SIGTERM, then SIGKILL to the whole process
// group of any that has not exited within ten seconds. It removes the grid's
// dir when Start created it.
func (g *Grid) Stop() {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return
	}
	g.stopped = true
	procs := g.procs
	g.mu.Unlock()
	// Reverse start order: workers, caddy, redis.
	for i := len(procs) - 1; i >= 0; i-- {
		stopGroup(procs[i], 10*time.Second)
	}
	if g.ownDir {
		_ = os.RemoveAll(g.cfg.Dir)
	}
}

func stopGroup(p *proc, grace time.Duration) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	// Whatever is left of the group (a browser the worker failed to close).
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

func waitTCP(ctx context.Context, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
