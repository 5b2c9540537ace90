package caddygrid_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// The tests of this package drive a real bin/caddy (make build), a real
// redis-server and real agents (the workeragent package, in this test
// process) running fakebrowser, as grid-worker does.

// grid is one test's Redis with its registry.
type grid struct {
	t     *testing.T
	redis *testenv.Redis
	reg   *registry.Registry
}

func newGrid(t *testing.T) *grid {
	t.Helper()
	r := testenv.StartRedis(t)
	rdb, err := registry.NewClient(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return &grid{t: t, redis: r, reg: registry.New(rdb, registry.Options{})}
}

// agent is one worker agent of the test.
type agent struct {
	*workeragent.Agent
	done chan error
	stop context.CancelFunc
}

// agent starts an agent with the fake launcher in pool and waits until
// its browser is registered.
func (g *grid) agent(pool string, tweak func(*workeragent.Config)) *agent {
	g.t.Helper()
	cfg := workeragent.Defaults()
	cfg.RedisURL = g.redis.URL()
	cfg.Pool = pool
	cfg.Launcher = workeragent.LauncherFake
	cfg.Fakebrowser = testenv.Bin(g.t, "fakebrowser")
	cfg.HeartbeatInterval = 500 * time.Millisecond
	cfg.StaleThreshold = 3 * time.Second
	cfg.DrainTimeout = 3 * time.Second
	cfg.IDPrefix = "w"
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := workeragent.New(cfg, zap.NewNop())
	if err != nil {
		g.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ag := &agent{Agent: a, done: make(chan error, 1), stop: cancel}
	before := len(g.workers(pool))
	go func() { ag.done <- a.Run(ctx) }()
	g.t.Cleanup(func() {
		cancel()
		a.Abort()
		select {
		case <-ag.done:
		case <-time.After(20 * time.Second):
			g.t.Error("an agent did not stop")
		}
	})
	testenv.Eventually(g.t, 15*time.Second, "the agent's browser registers", func() bool { return len(g.workers(pool)) > before })
	return ag
}

// workers reads a pool's workers, every version group's.
func (g *grid) workers(pool string) []registry.WorkerInfo {
	ctx := context.Background()
	vs, err := g.reg.Versions(ctx, pool)
	if err != nil {
		return nil
	}
	var out []registry.WorkerInfo
	for _, grp := range append([]string{pool}, vs.Groups(pool)...) {
		info, err := g.reg.Inspect(ctx, grp)
		if err != nil {
			continue
		}
		for _, w := range info.Workers {
			if !containsWorker(out, w.ID) {
				out = append(out, w)
			}
		}
	}
	return out
}

func containsWorker(ws []registry.WorkerInfo, id string) bool {
	for _, w := range ws {
		if w.ID == id {
			return true
		}
	}
	return false
}

// active sums the pool's active counts in Redis.
func (g *grid) active(pool string) int {
	n := 0
	for _, w := range g.workers(pool) {
		n += w.Active
	}
	return n
}

// caddy is a running bin/caddy.
type caddy struct {
	t         *testing.T
	proc      *testenv.Process
	dir       string
	config    string
	adminPort int
	httpPort  int
	plainPort int
	tls       bool
	env       []string
}

// caddyOpts shape the generated Caddyfile.
type caddyOpts struct {
	redisURL string
	// global goes inside the grid { } global option after redis.
	global string
	// site is the body of the site block.
	site string
	tls  bool
	// sites goes after the site block.
	sites string
	// stale is the grid's stale_threshold. Default: 3s.
	stale string
	// options go in the global options block after the grid option.
	options string
}

func (o caddyOpts) caddyfile(adminPort, port, plainPort int, storage string) string {
	https := "auto_https off"
	httpPort := port
	address := fmt.Sprintf("http://127.0.0.1:%d", port)
	if o.stale == "" {
		o.stale = "3s"
	}
	if o.tls {
		https = fmt.Sprintf("https_port %d\n\tlocal_certs\n\tskip_install_trust", port)
		httpPort = plainPort
		address = fmt.Sprintf("localhost:%d", port)
		o.site = "\ttls internal\n" + o.site
	}
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	%s
	persist_config off
	storage file_system %s
	grid {
		redis %s
		stale_threshold %s
		%s
	}
	%s
}

%s {
%s
}
%s
`, adminPort, httpPort, https, storage, o.redisURL, o.stale, o.global, o.options, address, o.site, o.sites)
}

func startCaddy(t *testing.T, o caddyOpts) *caddy {
	t.Helper()
	for attempt := 1; ; attempt++ {
		c, err := tryStartCaddy(t, o)
		if err == nil {
			return c
		}
		if !strings.Contains(err.Error(), "address already in use") || attempt == 5 {
			t.Fatalf("caddy did not start: %v", err)
		}
	}
}

func tryStartCaddy(t *testing.T, o caddyOpts) (*caddy, error) {
	t.Helper()
	bin := testenv.Bin(t, "caddy")
	ports := testenv.PickPorts(t, 3)
	c := &caddy{t: t, dir: t.TempDir(), adminPort: ports[0], httpPort: ports[1], plainPort: ports[2], tls: o.tls}
	c.config = filepath.Join(c.dir, "Caddyfile")
	c.write(o)
	c.env = []string{"HOME=" + c.dir, "XDG_DATA_HOME=" + filepath.Join(c.dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(c.dir, "config")}
	c.proc = testenv.Start(t, c.env, bin, "run", "--config", c.config, "--adapter", "caddyfile")
	t.Cleanup(func() {
		c.proc.Stop()
		if strings.Contains(c.proc.Output(), "panic") {
			t.Errorf("caddy panicked:\n%s", c.proc.Output())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(c.proc.Output(), "serving initial configuration") {
		select {
		case <-c.proc.Done():
			return nil, fmt.Errorf("caddy exited:\n%s", c.proc.Output())
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not serving after 20s:\n%s", c.proc.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := testenv.WaitTCP(fmt.Sprintf("127.0.0.1:%d", c.httpPort), 5*time.Second); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, c.proc.Output())
	}
	if o.tls && !c.proc.WaitOutput("certificate obtained successfully", 20*time.Second) {
		return nil, fmt.Errorf("no certificate from the internal CA after 20s:\n%s", c.proc.Output())
	}
	return c, nil
}

func (c *caddy) write(o caddyOpts) {
	c.t.Helper()
	src := o.caddyfile(c.adminPort, c.httpPort, c.plainPort, filepath.Join(c.dir, "storage"))
	if err := os.WriteFile(c.config, []byte(src), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// url is a ws:// (or wss://) URL on the site.
func (c *caddy) url(path string) string {
	if c.tls {
		return fmt.Sprintf("wss://localhost:%d%s", c.httpPort, path)
	}
	return fmt.Sprintf("ws://127.0.0.1:%d%s", c.httpPort, path)
}

func (c *caddy) httpURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", c.httpPort, path)
}

// reload writes a new config and applies it with 'caddy reload'.
func (c *caddy) reload(o caddyOpts) {
	c.t.Helper()
	c.write(o)
	p := testenv.Start(c.t, c.env, testenv.Bin(c.t, "caddy"), "reload", "--config", c.config, "--adapter", "caddyfile",
		"--address", fmt.Sprintf("127.0.0.1:%d", c.adminPort), "--force")
	if code, err := p.ExitCode(context.Background()); err != nil || code != 0 {
		c.t.Fatalf("caddy reload: %d %v\n%s", code, err, p.Output())
	}
}

// admin calls an admin route and returns the status and body.
func (c *caddy) admin(method, path string) (int, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, fmt.Sprintf("http://127.0.0.1:%d%s", c.adminPort, path), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// metric returns the value of one sample of Caddy's /metrics; 0 when it
// is missing.
func (c *caddy) metric(sample string) float64 {
	c.t.Helper()
	code, body := c.admin(http.MethodGet, "/metrics")
	if code != http.StatusOK {
		c.t.Fatalf("GET /metrics: %d %s", code, body)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, sample+" ") {
			v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, sample)), 64)
			return v
		}
	}
	return 0
}

// session is one client WebSocket through Caddy.
type session struct {
	conn *websocket.Conn
	resp *http.Response
}

// refused is a handshake answered with another status than 101.
type refused struct {
	StatusCode int
	Header     http.Header
	Body       []byte
	err        error
}

func (r *refused) Error() string { return fmt.Sprintf("%v: %s", r.err, r.Body) }
func (r *refused) Unwrap() error { return r.err }

func refusal(err error) *refused {
	var r *refused
	if errors.As(err, &r) {
		return r
	}
	return nil
}

func dial(ctx context.Context, u string) (*session, error) { return dialHeader(ctx, u, nil) }

// dialHeader opens a session with the request headers h and checks that it
// reaches a worker (an echo).
func dialHeader(ctx context.Context, u string, h http.Header) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body, _ := io.ReadAll(resp.Body)
			return nil, &refused{StatusCode: resp.StatusCode, Header: resp.Header, Body: body, err: err}
		}
		return nil, err
	}
	s := &session{conn: c, resp: resp}
	if err := s.echo("hello"); err != nil {
		c.CloseNow()
		return nil, err
	}
	return s, nil
}

func (s *session) echo(msg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	_, got, err := s.conn.Read(ctx)
	if err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if string(got) != msg {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// close runs the close handshake, at most 2 s.
func (s *session) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	go s.conn.Close(websocket.StatusNormalClosure, "")
	for {
		if _, _, err := s.conn.Read(ctx); err != nil {
			return
		}
	}
}

func mustDial(t *testing.T, u string) *session {
	t.Helper()
	s, err := dial(context.Background(), u)
	if err != nil {
		t.Fatalf("session through %s: %v", u, err)
	}
	t.Cleanup(func() { s.conn.CloseNow() })
	return s
}

// site is the usual site block: one browser_grid route with options.
func site(options string) string {
	return "\troute /playwright/* {\n\t\tbrowser_grid {\n" + options + "\n\t\t}\n\t}"
}

// status reads the agent's /status: what it knows for certain about its
// browsers.
func (a *agent) status(t *testing.T) workeragent.AgentStatus {
	t.Helper()
	st, err := agentStatus(a.Addr())
	if err != nil {
		t.Fatalf("agent /status: %v", err)
	}
	return st
}

func agentStatus(addr string) (workeragent.AgentStatus, error) {
	var st workeragent.AgentStatus
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET /status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// active is the live sessions the agent relays, over its browsers.
func (a *agent) active(t *testing.T) int {
	t.Helper()
	n := 0
	for _, b := range a.status(t).Browsers {
		n += b.Active
	}
	return n
}

// peakSampler polls agents' /status and keeps the most sessions any one
// browser held at once.
type peakSampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak map[string]int // worker ID -> most live sessions seen
	errs int
}

func samplePeaks(agents ...*agent) *peakSampler {
	s := &peakSampler{stop: make(chan struct{}), done: make(chan struct{}), peak: map[string]int{}}
	go func() {
		defer close(s.done)
		for {
			for _, a := range agents {
				st, err := agentStatus(a.Addr())
				s.mu.Lock()
				if err != nil {
					s.errs++
				}
				for _, b := range st.Browsers {
					s.peak[b.ID] = max(s.peak[b.ID], b.Active)
				}
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return s
}

// finish stops the sampler and returns the peaks.
func (s *peakSampler) finish() map[string]int {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.peak)
}

// worker finds a worker by ID in the pool's registry view.
func (g *grid) worker(pool, id string) (registry.WorkerInfo, bool) {
	for _, w := range g.workers(pool) {
		if w.ID == id {
			return w, true
		}
	}
	return registry.WorkerInfo{}, false
}

// fakeWorker registers a worker record the test writes itself, at addr
// (where nothing may answer, or an agent that runs no browser of that ID),
// with lifetime served so that lifetime_first tries it before any real
// worker. It heartbeats until the test ends, as an agent whose browser
// cannot be reached would.
func (g *grid) fakeWorker(pool, id, addr string, lifetime int) registry.Record {
	g.t.Helper()
	return g.register(registry.Record{ID: id, Pool: pool, Addr: addr}, lifetime)
}

// register registers rec (Browser and Path defaulted) as fakeWorker does.
func (g *grid) register(rec registry.Record, lifetime int) registry.Record {
	g.t.Helper()
	if rec.Browser == "" {
		rec.Browser = "chromium"
	}
	if rec.Path == "" {
		rec.Path = "/playwright"
	}
	rec = registry.NewRecord(rec, 0, nil)
	id := rec.ID
	st := registry.AgentState{Status: registry.Serving, Lifetime: lifetime}
	ctx := context.Background()
	if err := g.reg.Register(ctx, rec, st, ""); err != nil {
		g.t.Fatalf("registering %s: %v", id, err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			_, _ = g.reg.Heartbeat(ctx, rec.Group(), id, st)
		}
	}()
	g.t.Cleanup(func() { close(stop); <-done })
	return rec
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
}

// sessionOf reads the session a 101 answer named.
func (g *grid) sessionOf(pool string, s *session) registry.Session {
	g.t.Helper()
	id := s.resp.Header.Get(registry.HeaderSession)
	if id == "" {
		g.t.Fatal("the 101 answer names no session")
	}
	rs, ok, err := g.reg.GetSession(context.Background(), pool, id)
	if err != nil || !ok {
		g.t.Fatalf("session %s in Redis: %v %v", id, ok, err)
	}
	return rs
}

// closed waits for the server to close the session and returns the
// close frame's code and reason (-1 when the connection broke without
// one) and how long it took.
func (s *session) closed(timeout time.Duration) (websocket.StatusCode, string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	for {
		if _, _, err := s.conn.Read(ctx); err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return ce.Code, ce.Reason, time.Since(start), nil
			}
			return -1, "", time.Since(start), err
		}
	}
}

// get makes a plain HTTP request to the site and returns the answer with
// its body read.
func get(t *testing.T, client *http.Client, method, u string, h http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if client == nil {
		client = &http.Client{Timeout: 20 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// upgradeHeader is a valid WebSocket handshake's headers.
func upgradeHeader() http.Header {
	return http.Header{
		"Connection":            {"Upgrade"},
		"Upgrade":               {"websocket"},
		"Sec-Websocket-Version": {"13"},
		"Sec-Websocket-Key":     {"dGhlIHNhbXBsZSBub25jZQ=="},
	}
}

// rootCAs trusts the site's internal CA (tls internal).
func (c *caddy) rootCAs() *x509.CertPool {
	c.t.Helper()
	pem, err := os.ReadFile(filepath.Join(c.dir, "storage", "pki", "authorities", "local", "root.crt"))
	if err != nil {
		c.t.Fatalf("reading the internal CA's root: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		c.t.Fatal("the internal CA's root does not parse")
	}
	return pool
}

// adminAddr is Caddy's admin address, as 'caddy grid --address' takes it.
func (c *caddy) adminAddr() string { return fmt.Sprintf("127.0.0.1:%d", c.adminPort) }

// command runs 'caddy <args>' to its end and returns its exit code and
// combined output.
func (c *caddy) command(args ...string) (int, string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.Bin(c.t, "caddy"), args...)
	cmd.Env = append(os.Environ(), c.env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	c.t.Fatalf("caddy %s: %v\n%s", strings.Join(args, " "), err, out)
	return -1, ""
}

// adminJSON calls an admin route that must answer 200 and decodes it.
func (c *caddy) adminJSON(method, path string, v any) {
	c.t.Helper()
	code, body := c.admin(method, path)
	if code != http.StatusOK {
		c.t.Fatalf("%s %s: %d %s", method, path, code, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		c.t.Fatalf("%s %s: %v\n%s", method, path, err, body)
	}
}

// metricSamples returns the samples of Caddy's /metrics whose name is
// name, keyed by their label set as printed ({code="429",pool="x"}).
func (c *caddy) metricSamples(name string) map[string]float64 {
	c.t.Helper()
	code, body := c.admin(http.MethodGet, "/metrics")
	if code != http.StatusOK {
		c.t.Fatalf("GET /metrics: %d %s", code, body)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels, value, _ := strings.Cut(rest, " ")
		if labels != "" && labels[0] != '{' {
			labels, value = "", rest
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err == nil {
			out[labels] = v
		}
	}
	return out
}

// sessions lists the pool's session records.
func (g *grid) sessions(t *testing.T, pool string) []registry.Session {
	t.Helper()
	var out []registry.Session
	var cursor uint64
	for {
		ss, next, err := g.reg.Sessions(context.Background(), pool, cursor, 100)
		if err != nil {
			t.Fatalf("listing sessions: %v", err)
		}
		out = append(out, ss...)
		if cursor = next; cursor == 0 {
			return out
		}
	}
}

// justAfterHeartbeat returns once the worker's agent has sent a new
// heartbeat: what the test then does to Redis' counts stays so for a
// whole heartbeat interval.
func (g *grid) justAfterHeartbeat(pool, id string) {
	g.t.Helper()
	w, ok := g.worker(pool, id)
	if !ok {
		g.t.Fatalf("worker %s is not registered", id)
	}
	testenv.Eventually(g.t, 15*time.Second, "a heartbeat of "+id, func() bool {
		now, ok := g.worker(pool, id)
		return ok && now.LastHeartbeat.After(w.LastHeartbeat)
	})
}
