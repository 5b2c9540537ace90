package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"text/template"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/netns"
)

// Pool is the pool every scenario serves.
const Pool = "chromium"

// Timings every scenario's grid runs with: short enough that faults heal
// within a short run, in the ratios an operator would choose (heartbeat
// well under the stale threshold).
const (
	staleThreshold    = 3 * time.Second
	reaperInterval    = 2 * time.Second
	heartbeatInterval = time.Second
	proxyTimeout      = 3 * time.Second
	// healBound is what most faults must heal within: the agents' next
	// heartbeat rewrites the counts, and a claim that never reached its
	// agent ends a heartbeat plus the pending grace after it was made.
	healBound = 2 * heartbeatInterval
)

// env is one scenario's world: its dir, its processes, its Redis, its
// Caddy instances and its workers.
type env struct {
	bins    string
	dir     string
	procs   *procs
	topo    *topology
	caddies []*caddyInst
	workers []*workerInst
	logf    func(format string, args ...any)
	// undo is what the scenario set up outside its processes (links,
	// namespaces), torn down once they have stopped: a scenario's run
	// returns while its clients still go.
	undo []func()
}

func newEnv(bins, dir string, logf func(string, ...any)) *env {
	return &env{bins: bins, dir: dir, procs: &procs{dir: dir}, logf: logf}
}

func (e *env) close() {
	e.procs.stopAll(2 * time.Second)
	for i := len(e.undo) - 1; i >= 0; i-- {
		e.undo[i]()
	}
	if e.topo != nil && e.topo.rdb != nil {
		_ = e.topo.rdb.Close()
	}
}

// limits are a browser_grid handler's options.
type limits struct {
	MaxConcurrent int
	MaxLifetime   int
	SelectTimeout time.Duration
	// ReaperInterval of the instance's grid app (0: reaperInterval).
	ReaperInterval time.Duration
	// StaleThreshold of the instance's grid app (0: staleThreshold).
	StaleThreshold time.Duration
	// Policy is the handler's policy line ("": the default, lifetime_first).
	Policy string
	// Extra goes into the handler's block as it is.
	Extra string
}

// caddyInst is one running bin/caddy.
type caddyInst struct {
	name      string
	adminPort int
	port      int
	// host is the address its site listens on (127.0.0.1, or its
	// network namespace's).
	host     string
	dir      string
	config   string
	env      []string
	p        *proc
	lim      limits
	redisURL string
}

var caddyfileTmpl = template.Must(template.New("Caddyfile").Parse(`{
	admin 127.0.0.1:{{.Admin}}
	http_port {{.Port}}
	auto_https off
	persist_config off
	storage file_system {{.Storage}}
	grid {
		redis {{.Redis}}
		stale_threshold {{.Stale}}
		reaper_interval {{.Reaper}}
	}
}

http://{{.Host}}:{{.Port}} {
	route /playwright/* {
		browser_grid {{.Pool}} {
			max_concurrent {{.Lim.MaxConcurrent}}
			max_lifetime {{.Lim.MaxLifetime}}
			select_timeout {{.Lim.SelectTimeout}}
			{{- if .Lim.Policy}}
			policy {{.Lim.Policy}}
			{{- end}}
			{{- if .Lim.Extra}}
			{{.Lim.Extra}}
			{{- end}}
		}
	}
}
`))

func (c *caddyInst) write() error {
	reaper, stale := c.lim.ReaperInterval, c.lim.StaleThreshold
	if reaper == 0 {
		reaper = reaperInterval
	}
	if stale == 0 {
		stale = staleThreshold
	}
	var b bytes.Buffer
	err := caddyfileTmpl.Execute(&b, map[string]any{
		"Admin": c.adminPort, "Port": c.port, "Storage": filepath.Join(c.dir, "storage"),
		"Redis": c.redisURL, "Stale": stale.String(), "Host": c.host,
		"Reaper": reaper.String(), "Pool": Pool, "Lim": c.lim,
	})
	if err != nil {
		return err
	}
	return os.WriteFile(c.config, b.Bytes(), 0o644)
}

// startCaddy starts a bin/caddy named name with lim, on the env's Redis.
func (e *env) startCaddy(name string, lim limits) (*caddyInst, error) {
	return e.startCaddyAt(name, lim, caddyPlace{})
}

// caddyPlace is where a Caddy runs: its own network namespace, and the
// Redis URL it uses (a black hole's), when not the defaults.
type caddyPlace struct {
	host     *netns.Host
	redisURL string
}

func (e *env) startCaddyAt(name string, lim limits, at caddyPlace) (*caddyInst, error) {
	c := &caddyInst{name: name, dir: filepath.Join(e.dir, name), lim: lim, redisURL: e.topo.url, host: "127.0.0.1"}
	if at.redisURL != "" {
		c.redisURL = at.redisURL
	}
	var err error
	if c.adminPort, err = freePort(); err != nil {
		return nil, err
	}
	if c.port, err = freePort(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, err
	}
	c.config = filepath.Join(c.dir, "Caddyfile")
	bin, args := filepath.Join(e.bins, "caddy"), []string{"run", "--config", c.config, "--adapter", "caddyfile"}
	if at.host != nil {
		c.host = at.host.Inside
		bin, args = "ip", append([]string{"netns", "exec", at.host.Name, bin}, args...)
	}
	if err := c.write(); err != nil {
		return nil, fmt.Errorf("writing the Caddyfile of %s: %w", name, err)
	}
	c.env = []string{"HOME=" + c.dir, "XDG_DATA_HOME=" + filepath.Join(c.dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(c.dir, "config")}
	c.p, err = e.procs.start(name, c.env, bin, args...)
	if err != nil {
		return nil, err
	}
	if err := waitTCP(c.addr(), c.p, 30*time.Second); err != nil {
		return nil, fmt.Errorf("caddy %s did not start: %w", name, err)
	}
	e.caddies = append(e.caddies, c)
	return c, nil
}

func (c *caddyInst) addr() string { return c.host + ":" + strconv.Itoa(c.port) }

// url is the WebSocket URL clients dial.
func (c *caddyInst) url() string { return "ws://" + c.addr() + "/playwright/" + Pool }

// reload applies lim with `caddy reload` and waits for it to finish.
func (c *caddyInst) reload(bins string, lim limits) error {
	c.lim = lim
	if err := c.write(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bins, "caddy"), "reload", "--config", c.config, "--adapter", "caddyfile",
		"--address", "127.0.0.1:"+strconv.Itoa(c.adminPort), "--force")
	cmd.Env = append(os.Environ(), c.env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("caddy reload of %s: %w\n%s", c.name, err, out)
	}
	return nil
}

// workerInst is one bin/grid-worker running a fakebrowser.
type workerInst struct {
	name string
	p    *proc
	// args are its flags, to start it again the same way.
	args []string
}

// startWorker starts grid-worker number i with capacity maxConcurrent;
// it respawns its browser after a drain, as in production. extra flags go
// last (they win).
func (e *env) startWorker(i, maxConcurrent int, extra ...string) (*workerInst, error) {
	name := fmt.Sprintf("worker-%d", i)
	args := []string{
		"--redis", e.topo.url,
		"--pool", Pool,
		"--launcher", "fake",
		"--fakebrowser", filepath.Join(e.bins, "fakebrowser"),
		"--max-concurrent", strconv.Itoa(maxConcurrent),
		"--heartbeat-interval", heartbeatInterval.String(),
		"--stale-threshold", staleThreshold.String(),
		"--proxy-timeout", proxyTimeout.String(),
		"--drain-timeout", "30s",
		"--redis-retry-attempts", "30",
		"--id-prefix", name,
		"--log-format", "console",
		"--respawn",
	}
	args = append(args, extra...)
	p, err := e.procs.start(name, nil, filepath.Join(e.bins, "grid-worker"), args...)
	if err != nil {
		return nil, err
	}
	w := &workerInst{name: name, p: p, args: args}
	e.workers = append(e.workers, w)
	return w, nil
}
