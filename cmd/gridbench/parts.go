package main

// The real parts the sections run: a private redis-server, bin/caddy, and
// bin/grid-worker agents with bin/fakebrowser behind them. Each is a child
// process in its own process group with its output in a log file of its
// world's temp dir; the world stops them all when its section ends.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// world is one section's running parts around one private redis-server.
type world struct {
	dir   string
	procs []*proc
	// redis is the redis-server's address (port its port), rdb a client
	// of it and reg a registry over rdb.
	redis string
	port  int
	rdb   *redis.Client
	reg   *registry.Registry
}

// newWorld starts a redis-server on a free port, without persistence, in
// a temp dir.
func newWorld() (*world, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found on PATH (make deps installs it)")
	}
	dir, err := os.MkdirTemp("", "gridbench-")
	if err != nil {
		return nil, err
	}
	w := &world{dir: dir}
	ports, err := freePorts(1)
	if err != nil {
		w.close()
		return nil, err
	}
	w.port = ports[0]
	w.redis = "127.0.0.1:" + strconv.Itoa(w.port)
	p, err := w.start("redis", bin, "--port", strconv.Itoa(w.port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning")
	if err == nil {
		err = waitTCP(w.redis, p, 10*time.Second)
	}
	if err != nil {
		w.close()
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	w.rdb = redis.NewClient(&redis.Options{Addr: w.redis, PoolSize: 8})
	w.reg = registry.New(w.rdb, registry.Options{})
	return w, nil
}

// redisURL is the URL Caddy and the agents are given.
func (w *world) redisURL() string { return "redis://" + w.redis + "/0" }

// close stops every process, Redis last (an agent that stops deregisters
// its browser there), and removes the temp dir.
func (w *world) close() {
	if w.rdb != nil {
		_ = w.rdb.Close()
	}
	var wg sync.WaitGroup
	for _, p := range w.procs[min(1, len(w.procs)):] {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop() }()
	}
	wg.Wait()
	if len(w.procs) > 0 {
		w.procs[0].stop()
	}
	_ = os.RemoveAll(w.dir)
}

// proc is one child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs bin with args in the world's dir, in an environment of its
// own: the parts run with their defaults whatever the caller's
// environment holds (grid-worker reads HEARTBEAT_INTERVAL,
// GRID_WORKER_SECRET and more from it).
func (w *world) start(name, bin string, args ...string) (*proc, error) {
	log := filepath.Join(w.dir, name+".log")
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = w.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + w.dir, "TMPDIR=" + w.dir,
		"XDG_DATA_HOME=" + filepath.Join(w.dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(w.dir, "config")}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &proc{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	w.procs = append(w.procs, p)
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, and SIGKILL to what is left
// after 10 s (an agent drains its browser first).
func (p *proc) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// tail is the end of the process's log, for an error message.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return fmt.Sprintf("%s log:\n%s", p.name, strings.TrimSpace(string(b)))
}

// waitTCP waits until addr accepts a connection, or p exits, or timeout
// passes.
func waitTCP(addr string, p *proc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited before listening on %s\n%s", p.name, addr, p.tail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not listen on %s within %s\n%s", p.name, addr, timeout, p.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePorts returns n ports of 127.0.0.1 free a moment ago, taken at once
// so that none comes back twice.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// findBin locates a binary of this repository: beside the gridbench
// binary, else in bin/.
func findBin(name string) (string, error) {
	var tried []string
	if exe, err := os.Executable(); err == nil {
		tried = append(tried, filepath.Join(filepath.Dir(exe), name))
	}
	tried = append(tried, filepath.Join("bin", name))
	for _, p := range tried {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return filepath.Abs(p)
		}
	}
	return "", fmt.Errorf("%s not found (looked at %s); run 'make build'", name, strings.Join(tried, ", "))
}

// startAgents starts n agents serving pool, each fronting a fakebrowser,
// with the agents' defaults but for flags, and waits until each one's
// browser is registered and available. The agents are given no worker
// secret (nor is Caddy): claim tickets go unsigned.
func (w *world) startAgents(n int, pool string, flags ...string) error {
	agent, err := findBin("grid-worker")
	if err != nil {
		return err
	}
	fake, err := findBin("fakebrowser")
	if err != nil {
		return err
	}
	var ps []*proc
	for i := range n {
		name := fmt.Sprintf("agent%d", i)
		args := append([]string{"--redis", w.redisURL(), "--pool", pool, "--launcher", "fake", "--fakebrowser", fake,
			"--id-prefix", name, "--log-format", "console"}, flags...)
		p, err := w.start(name, agent, args...)
		if err != nil {
			return err
		}
		ps = append(ps, p)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ws, err := w.available(pool)
		if err != nil {
			return err
		}
		if len(ws) >= n {
			return nil
		}
		for _, p := range ps {
			if p.exited() {
				return fmt.Errorf("agent %s exited\n%s", p.name, p.tail())
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d agents registered within 30 s\n%s", len(ws), n, ps[0].tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// available lists pool's workers whose status in Redis is available.
func (w *world) available(pool string) ([]registry.WorkerInfo, error) {
	groups, _, err := w.reg.InspectPool(context.Background(), pool)
	if err != nil {
		return nil, err
	}
	var out []registry.WorkerInfo
	for _, g := range groups {
		for _, wk := range g.Workers {
			if wk.Status == "available" {
				out = append(out, wk)
			}
		}
	}
	return out, nil
}

// sessionsLeft counts pool's session records.
func (w *world) sessionsLeft(pool string) (int64, error) {
	return w.rdb.HLen(context.Background(), w.reg.Key(pool, "sessions")).Result()
}

// waitNoSessions waits until pool has no session record left (the agents
// have written every end), up to timeout; it returns how many are left.
func (w *world) waitNoSessions(pool string, timeout time.Duration) (int64, error) {
	deadline := time.Now().Add(timeout)
	for {
		n, err := w.sessionsLeft(pool)
		if err != nil || n == 0 || time.Now().After(deadline) {
			return n, err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// caddyProc is one running bin/caddy.
type caddyProc struct {
	*proc
	admin string
	// sites are the addresses its sites listen on.
	sites []string
}

// startCaddy runs bin/caddy on the world's Redis, with the grid app's
// defaults, and nsites site blocks that sites writes for the addresses it
// is given; it waits until every site listens.
func (w *world) startCaddy(name string, nsites int, sites func(addrs []string) string) (*caddyProc, error) {
	bin, err := findBin("caddy")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(nsites + 1)
	if err != nil {
		return nil, err
	}
	c := &caddyProc{admin: "127.0.0.1:" + strconv.Itoa(ports[0])}
	for _, p := range ports[1:] {
		c.sites = append(c.sites, "127.0.0.1:"+strconv.Itoa(p))
	}
	dir := filepath.Join(w.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`{
	admin %s
	auto_https off
	persist_config off
	storage file_system %s
	log {
		level WARN
	}
	grid {
		redis %s
	}
}

%s`, c.admin, filepath.Join(dir, "storage"), w.redisURL(), sites(c.sites))
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	if c.proc, err = w.start(name, bin, "run", "--config", path, "--adapter", "caddyfile"); err != nil {
		return nil, err
	}
	for _, addr := range c.sites {
		if err := waitTCP(addr, c.proc, 30*time.Second); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// gridSite is a site block serving pool through the browser_grid handler
// with the handler's options in block.
// gridInstances starts n bin/caddy instances, each serving benchPool
// with the handler block, and returns a route through each.
func (w *world) gridInstances(n int, block string) ([]route, error) {
	var routes []route
	for i := range n {
		name := "caddy" + strconv.Itoa(i)
		cad, err := w.startCaddy(name, 1, func(a []string) string { return gridSite(a[0], benchPool, block) })
		if err != nil {
			return nil, err
		}
		routes = append(routes, route{name: name, url: "ws://" + cad.sites[0] + "/"})
	}
	return routes, nil
}

func gridSite(addr, pool, block string) string {
	if block == "" {
		return fmt.Sprintf("http://%s {\n\tbrowser_grid %s\n}\n", addr, pool)
	}
	return fmt.Sprintf("http://%s {\n\tbrowser_grid %s {\n%s\t}\n}\n", addr, pool, block)
}
