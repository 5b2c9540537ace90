package caddygrid_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/sockets"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// The tests of this file's package drive a real bin/caddy (make build), a
// real redis-server, and fakebrowser servers registered in Redis through
// the registry package, as a worker agent would register them.

// grid is one test's Redis with its registry.
type grid struct {
	t     *testing.T
	redis *testenv.Redis
	rdb   redis.UniversalClient
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
	return &grid{t: t, redis: r, rdb: rdb, reg: registry.New(rdb, registry.Options{})}
}

// workerTTL keeps registered records alive for the whole test (there is no
// agent heartbeating them).
const workerTTL = 10 * time.Minute

// worker starts a fakebrowser server and registers it in pool as id.
func (g *grid) worker(pool, id string, b fake.Behavior) *fake.Server {
	g.t.Helper()
	srv, ep, err := fake.Start("127.0.0.1:0", fake.Options{Path: "/playwright", Behavior: b})
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { srv.Close() })
	u, err := url.Parse(ep)
	if err != nil {
		g.t.Fatal(err)
	}
	err = g.reg.Register(context.Background(), registry.Registration{
		Pool: pool, ID: id, BrowserType: pool, Addr: u.Host, Path: u.Path, TTL: workerTTL,
	})
	if err != nil {
		g.t.Fatalf("registering worker %s: %v", id, err)
	}
	return srv
}

// info reads one worker's record.
func (g *grid) info(pool, id string) registry.WorkerInfo {
	g.t.Helper()
	w, err := g.reg.Worker(context.Background(), pool, id)
	if err != nil {
		g.t.Fatalf("reading worker %s: %v", id, err)
	}
	return w
}

// limits reads the limits a pool runs under (the last a claim stored).
func (g *grid) limits(pool string) selection.Limits {
	g.t.Helper()
	info, err := g.reg.Inspect(context.Background(), pool)
	if err != nil {
		g.t.Fatalf("inspecting pool %s: %v", pool, err)
	}
	return info.Limits
}

// caddy is a running bin/caddy.
type caddy struct {
	t         *testing.T
	proc      *testenv.Process
	dir       string
	config    string
	adminPort int
	httpPort  int
	plainPort int // HTTP port when the site is HTTPS
	tls       bool
	env       []string
}

// caddyOpts shape the generated Caddyfile.
type caddyOpts struct {
	redisURL string
	// global goes inside the grid { } global option after redis.
	global string
	// extraGlobal goes into the global options block.
	extraGlobal string
	// site is the body of the site block: http://127.0.0.1:<port>, or
	// with tls, https://localhost:<port> with Caddy's internal CA.
	site string
	tls  bool
	// sites goes after the site block (more site blocks).
	sites string
}

func (o caddyOpts) caddyfile(adminPort, port, plainPort int, storage string) string {
	https := "auto_https off"
	httpPort := port
	global := o.global
	if !strings.Contains(global, "stale_threshold") {
		// The test's workers never heartbeat.
		global = "stale_threshold 10m\n\t\t" + global
	}
	address := fmt.Sprintf("http://127.0.0.1:%d", port)
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
	%s
	grid {
		redis %s
		%s
	}
}

%s {
%s
}
%s
`, adminPort, httpPort, https, storage, o.extraGlobal, o.redisURL, global, address, o.site, o.sites)
}

// caddyBin is bin/caddy, or the binary named by CADDYGRID_TEST_CADDY (for
// example one built with -race: the tests then also fail on a data race
// reported by Caddy).
func caddyBin(t *testing.T) string {
	if p := os.Getenv("CADDYGRID_TEST_CADDY"); p != "" {
		return p
	}
	return testenv.Bin(t, "caddy")
}

// startCaddy runs bin/caddy with the generated config on free ports. A
// port taken between the pick and Caddy's bind (by a test of another
// package) costs a start on other ports, not a failed test.
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
	bin := caddyBin(t)
	ports := testenv.PickPorts(t, 3)
	c := &caddy{t: t, dir: t.TempDir(), adminPort: ports[0], httpPort: ports[1], plainPort: ports[2], tls: o.tls}
	c.config = filepath.Join(c.dir, "Caddyfile")
	c.write(o)
	c.env = []string{
		"HOME=" + c.dir,
		"XDG_DATA_HOME=" + filepath.Join(c.dir, "data"),
		"XDG_CONFIG_HOME=" + filepath.Join(c.dir, "config"),
	}
	c.proc = testenv.Start(t, c.env, bin, "run", "--config", c.config, "--adapter", "caddyfile")
	t.Cleanup(func() {
		c.proc.Stop()
		if strings.Contains(c.proc.Output(), "DATA RACE") {
			t.Errorf("caddy reported a data race:\n%s", c.proc.Output())
		}
	})
	// Caddy's own log line, not a listener on the port (which could be
	// another process's): it is logged once every listener is bound.
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
	if err := testenv.WaitTCP(c.addr(), 5*time.Second); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, c.proc.Output())
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

func (c *caddy) addr() string { return fmt.Sprintf("127.0.0.1:%d", c.httpPort) }

// url is a ws:// (or wss://) URL on the site.
func (c *caddy) url(path string) string {
	if c.tls {
		return fmt.Sprintf("wss://localhost:%d%s", c.httpPort, path)
	}
	return "ws://" + c.addr() + path
}

// rootCA is the path of Caddy's local root certificate.
func (c *caddy) rootCA() string {
	return filepath.Join(c.dir, "storage", "pki", "authorities", "local", "root.crt")
}

// reload writes a new config and applies it with 'caddy reload'.
func (c *caddy) reload(o caddyOpts) {
	c.t.Helper()
	if code, out := c.tryReload(o); code != 0 {
		c.t.Fatalf("caddy reload: exit %d\n%s", code, out)
	}
}

// tryReload writes a new config, runs 'caddy reload' and returns its exit
// code and output, for reloads that are meant to fail.
func (c *caddy) tryReload(o caddyOpts) (int, string) {
	c.t.Helper()
	c.write(o)
	p := testenv.Start(c.t, c.env, caddyBin(c.t), "reload", "--config", c.config, "--adapter", "caddyfile",
		"--address", fmt.Sprintf("127.0.0.1:%d", c.adminPort), "--force")
	code, err := p.ExitCode(context.Background())
	if err != nil {
		c.t.Fatalf("caddy reload: %v\n%s", err, p.Output())
	}
	c.replacedListenersClosed()
	return code, p.Output()
}

// admin GETs (or POSTs) an admin path and returns status and body.
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

// metric returns the value of one sample of Caddy's /metrics, e.g.
// metric(`caddy_grid_selections_total{policy="lifetime_first",pool="chromium"}`);
// a missing sample is 0.
func (c *caddy) metric(sample string) float64 {
	c.t.Helper()
	code, body := c.admin(http.MethodGet, "/metrics")
	if code != http.StatusOK {
		c.t.Fatalf("GET /metrics: %d %s", code, body)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, sample+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, sample)), 64)
			if err != nil {
				c.t.Fatalf("metric %s: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// session is one client WebSocket through Caddy.
type session struct {
	conn *websocket.Conn
}

// refused is a handshake answered with an HTTP status other than 101.
type refused struct {
	StatusCode int
	Header     http.Header
	// Body is the start of the answer's body (the WebSocket library keeps
	// its first KiB).
	Body []byte
	err  error
}

func (r *refused) Error() string { return fmt.Sprintf("%v: %s", r.err, r.Body) }
func (r *refused) Unwrap() error { return r.err }

// dial opens a session and checks that it reaches a worker (an echo). A
// refused handshake is a *refused (see refusal).
func dial(ctx context.Context, u string) (*session, error) {
	return dialHeader(ctx, u, nil)
}

// dialHeader is dial with the handshake's request headers.
func dialHeader(ctx context.Context, u string, h http.Header) (*session, error) {
	// The timeout bounds the handshake only: the session outlives it.
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
	s := &session{conn: c}
	if err := s.echo("hello"); err != nil {
		c.CloseNow()
		return nil, err
	}
	return s, nil
}

func (s *session) echo(msg string) error {
	// A read that runs out of time closes the session.
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

// close runs the close handshake, dropping the connection when the peer
// has not answered within 2 s (the library alone waits up to 5 s).
func (s *session) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	go s.conn.Close(websocket.StatusNormalClosure, "")
	// The peer's answering close frame ends this read; a read that runs
	// out of time drops the connection, which ends Close as well.
	for {
		if _, _, err := s.conn.Read(ctx); err != nil {
			return
		}
	}
}

// refusal returns the refused handshake behind err, or nil.
func refusal(err error) *refused {
	var r *refused
	if errors.As(err, &r) {
		return r
	}
	return nil
}

// mustDial opens a session or fails the test.
func mustDial(t *testing.T, u string) *session {
	t.Helper()
	s, err := dial(context.Background(), u)
	if err != nil {
		t.Fatalf("session through %s: %v", u, err)
	}
	return s
}

// replacedListenersClosed waits until the site's port has at most one
// listener again, the running config's. A reload binds the new config's
// listeners beside the old ones (Caddy sets SO_REUSEPORT, and the kernel
// hands each new connection to one of a port's listeners), then stops
// the replaced config's servers, or the failed config's, in goroutines
// whose end it does not wait for. Go's HTTP server closes unanswered a
// connection whose request it reads once its shutdown has begun, and
// Linux resets the connections still queued on a listener that closes:
// a session dialled before then can be cut by Caddy, never having
// reached the grid. A listener still open after 10 s is a leak.
func (c *caddy) replacedListenersClosed() {
	c.t.Helper()
	testenv.Eventually(c.t, 10*time.Second, "the replaced configs' listeners closed, the running one's left", func() bool {
		n, err := sockets.Listening(c.httpPort)
		if err != nil {
			c.t.Fatal(err)
		}
		return n <= 1
	})
}

// heldServer is an HTTP server that holds every request until release is
// called, then answers status: an auth check or a config loader that a
// test keeps waiting. asked gets a value when a request first arrives
// (later arrivals while it is full are not announced). release is safe
// to call twice; the test's cleanup calls it too.
func heldServer(t *testing.T, status int) (addr string, asked <-chan struct{}, release func()) {
	t.Helper()
	ask, answer := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		select {
		case ask <- struct{}{}:
		default:
		}
		<-answer
		rw.WriteHeader(status)
	}))
	var once sync.Once
	release = func() { once.Do(func() { close(answer) }) }
	t.Cleanup(srv.Close)
	t.Cleanup(release) // runs first: the server's Close waits for its held requests
	return srv.Listener.Addr().String(), ask, release
}
