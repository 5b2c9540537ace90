package examples

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The client authentication recipes (auth-*.Caddyfile), proven the way a
// user runs them: one real grid-worker with Chromium behind Playwright's
// browser server, and for each recipe in turn a real bin/caddy serving
// wss:// with its internal CA, running the recipe's golden config with only
// where it listens, stores and finds Redis changed. A real playwright-core
// client without credentials is refused (401) and no worker is claimed;
// with them its session works. No secret appears in anything Caddy logs,
// even at debug level, and none reaches the worker.

// authRecipe is one recipe and how a client presents its credentials.
type authRecipe struct {
	file string
	// env is what the recipe reads from the environment, from the secret.
	env func(t *testing.T, secret string) []string
	// with and without are what a client adds: a URL suffix and a header
	// ("Name: value"), either empty.
	with, without func(secret string) (suffix, header string)
	// accessLog: the recipe keeps an access log, which must record the
	// requests without the secret.
	accessLog bool
	// failedSession: also send an authorized request that fails (every
	// worker it is offered refuses the dial): Caddy logs a handler error
	// with the request as the client sent it.
	failedSession bool
	// empty is what a client sends to try an empty secret: refused when
	// the recipe runs with its secret unset.
	empty func() (suffix, header string)
}

func TestAuthRecipesWithPlaywright(t *testing.T) {
	node := testenv.LookPath(t, "node")
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		testenv.Missing(t, "/usr/bin/chromium not installed")
	}
	root := testenv.RepoRoot(t)
	pwDir := filepath.Join(root, "playwright")
	if _, err := os.Stat(filepath.Join(pwDir, "node_modules", "playwright-core")); err != nil {
		testenv.Missing(t, "playwright-core not installed in playwright/ (run 'make deps')")
	}
	caddy := testenv.Bin(t, "caddy")

	// One worker serves every recipe's sessions: one Chromium for the test.
	redis := testenv.StartRedis(t)
	testenv.Start(t, []string{"GRID_PLAYWRIGHT_DIR=" + pwDir}, testenv.Bin(t, "grid-worker"),
		"-redis", redis.URL(), "-pool", "chromium", "-launcher", "playwright", "-max-concurrent", "2",
		"-start-timeout", "60s", "-log-format", "json")
	rdb, err := registry.NewClient(redis.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	reg := registry.New(rdb, registry.Options{})
	testenv.Eventually(t, 90*time.Second, "the Chromium worker to register", func() bool {
		ws, err := poolWorkers(context.Background(), reg)
		return err == nil && len(ws) == 1 && ws[0].Status == "available"
	})

	none := func(string) (string, string) { return "", "" }
	recipes := []authRecipe{
		{
			file: "auth-basic.Caddyfile",
			env: func(t *testing.T, secret string) []string {
				out, err := exec.Command(caddy, "hash-password", "--plaintext", secret, "--bcrypt-cost", "10").Output()
				if err != nil {
					t.Fatalf("caddy hash-password: %v", err)
				}
				return []string{"GRID_PASSWORD_HASH=" + strings.TrimSpace(string(out))}
			},
			with: func(secret string) (string, string) {
				return "", "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("playwright:"+secret))
			},
			without: func(secret string) (string, string) {
				return "", "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("playwright:wrong-"+secret))
			},
		},
		{
			file:  "auth-bearer.Caddyfile",
			env:   func(_ *testing.T, secret string) []string { return []string{"GRID_TOKEN=" + secret} },
			with:  func(secret string) (string, string) { return "", "Authorization: Bearer " + secret },
			empty: func() (string, string) { return "", "Authorization: Bearer " },
			without: func(secret string) (string, string) {
				return "", "Authorization: Bearer " + secret[:len(secret)-1]
			},
		},
		{
			file:          "auth-query-token.Caddyfile",
			env:           func(_ *testing.T, secret string) []string { return []string{"GRID_TOKEN=" + secret} },
			with:          func(secret string) (string, string) { return "?token=" + secret, "" },
			without:       func(secret string) (string, string) { return "?token=" + secret[:len(secret)-1], "" },
			accessLog:     true,
			failedSession: true,
			empty:         func() (string, string) { return "?token=", "" },
		},
	}
	for _, rc := range recipes {
		t.Run(rc.file, func(t *testing.T) {
			secret := randomHex(t)
			start := time.Now()
			srv := startRecipe(t, caddy, rc.file, redis.URL(), rc.env(t, secret))
			t.Logf("caddy ready after %s", time.Since(start).Round(time.Millisecond))
			before := workerFigures(t, reg)

			// Refused: a Playwright client without credentials sees the
			// 401; plain upgrade requests without and with wrong ones get
			// it exactly.
			if res := srv.playwright(t, node, "", ""); res.OK || !strings.Contains(res.Error, "401") {
				t.Errorf("Playwright session without credentials %+v, want refused with 401", res)
			}
			for name, creds := range map[string]func(string) (string, string){"no credentials": none, "wrong credentials": rc.without} {
				suffix, header := creds(secret)
				if code := srv.upgradeStatus(t, suffix, header); code != http.StatusUnauthorized {
					t.Errorf("%s: upgrade answered %d, want 401", name, code)
				}
			}
			t.Logf("refusals checked after %s", time.Since(start).Round(time.Millisecond))
			if got := workerFigures(t, reg); got != before {
				t.Fatalf("refused clients moved the worker from %+v to %+v: a worker was claimed", before, got)
			}

			// Served: a whole Playwright session through the grid.
			suffix, header := rc.with(secret)
			if res := srv.playwright(t, node, suffix, header); !res.OK || res.Title != "grid session 1" {
				t.Fatalf("Playwright session with credentials: %+v", res)
			}
			testenv.Eventually(t, 15*time.Second, "the session's slot released", func() bool {
				got := workerFigures(t, reg)
				return got.active == 0 && got.lifetime == before.lifetime+1
			})

			// Served too: the same client to the https:// endpoint, which
			// first reads its /json without the client's headers.
			https := strings.Replace(srv.url(suffix), "wss://", "https://", 1)
			if res := srv.playwrightAt(t, node, https, header); !res.OK {
				t.Errorf("Playwright session with credentials to %s: %+v", https, res)
			}
			testenv.Eventually(t, 15*time.Second, "the second session's slot released", func() bool {
				got := workerFigures(t, reg)
				return got.active == 0 && got.lifetime == before.lifetime+2
			})

			t.Logf("session served after %s", time.Since(start).Round(time.Millisecond))
			if rc.failedSession {
				failedSession(t, reg, srv, suffix, header)
			}
			srv.proc.Stop()
			t.Logf("caddy stopped after %s", time.Since(start).Round(time.Millisecond))
			srv.checkLogs(t, secret, rc.accessLog)

			// Run with the secret unset, the recipe admits no empty one.
			if rc.empty != nil {
				srv := startRecipe(t, caddy, rc.file, redis.URL(), []string{"GRID_TOKEN="})
				suffix, header := rc.empty()
				if code := srv.upgradeStatus(t, suffix, header); code != http.StatusUnauthorized {
					t.Errorf("GRID_TOKEN unset, an empty token: upgrade answered %d, want 401", code)
				}
				srv.proc.Stop()
			}
		})
	}
}

// failedSession sends an authorized upgrade that every worker it is offered
// fails: the real worker is made suspect, and dial_retries+1 workers that
// listen nowhere are registered. The grid answers 502 (a handler error,
// logged with the request). The dead workers are removed afterwards; the
// real one stays suspect for a minute.
func failedSession(t *testing.T, reg *registry.Registry, srv *recipeServer, suffix, header string) {
	t.Helper()
	ctx := context.Background()
	// The worker registered in its Playwright version's group of the pool:
	// the dead workers join it there, where the request is routed.
	ws, err := poolWorkers(ctx, reg)
	if err != nil || len(ws) != 1 {
		t.Fatalf("reading the pool: %v (%d workers)", err, len(ws))
	}
	real := ws[0]
	if _, err := reg.GiveBack(ctx, real.Group, real.ID, true, time.Minute); err != nil {
		t.Fatalf("making the worker suspect: %v", err)
	}
	var dead []string
	for i := range 3 { // DefaultDialRetries + 1
		rec := registry.NewRecord(registry.Record{ID: fmt.Sprintf("dead-%d", i), Pool: real.Pool, Version: real.Version,
			Browser: "chromium", Addr: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), Path: "/playwright", Capacity: 2}, 0, nil)
		if err := reg.Register(ctx, rec, registry.AgentState{}, ""); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, rec.ID)
	}
	t.Cleanup(func() {
		for _, id := range dead {
			_ = reg.Deregister(context.Background(), real.Group, id)
		}
	})
	if code := srv.upgradeStatus(t, suffix, header); code != http.StatusBadGateway {
		t.Errorf("an authorized session every worker fails: status %d, want 502", code)
	}
}

// poolWorkers are the workers of every version group of pool chromium.
func poolWorkers(ctx context.Context, reg *registry.Registry) ([]registry.WorkerInfo, error) {
	infos, _, err := reg.InspectPool(ctx, "chromium")
	var out []registry.WorkerInfo
	for _, gi := range infos {
		out = append(out, gi.Workers...)
	}
	return out, err
}

type figures struct{ active, lifetime int }

// workerFigures reads the one worker's live sessions and lifetime.
func workerFigures(t *testing.T, reg *registry.Registry) figures {
	t.Helper()
	ws, err := poolWorkers(context.Background(), reg)
	if err != nil {
		t.Fatalf("reading the pool: %v", err)
	}
	if len(ws) != 1 {
		t.Fatalf("pool has %d workers, want the one test worker", len(ws))
	}
	return figures{ws[0].Active, ws[0].Lifetime}
}

func randomHex(t *testing.T) string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// recipeServer is a bin/caddy running one recipe.
type recipeServer struct {
	proc        *testenv.Process
	port        int
	rootCA      string
	roots       *x509.CertPool
	upstreamLog string
}

// startRecipe runs the recipe's golden config (what the Caddyfile adapts
// to, checked by TestExamplesAdapt) with these changes only: it listens on
// a free port without the HTTP redirect server, keeps its storage in a temp
// dir, has no admin listener, uses the test's Redis, and logs at debug
// level so the log check sees every line Caddy can write.
func startRecipe(t *testing.T, caddy, file, redisURL string, env []string) *recipeServer {
	t.Helper()
	raw, err := os.ReadFile(golden(file))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("decoding %s: %v", golden(file), err)
	}
	dir := t.TempDir()
	port := testenv.FreePort(t)
	cfg["admin"] = map[string]any{"disabled": true}
	cfg["storage"] = map[string]any{"module": "file_system", "root": filepath.Join(dir, "storage")}
	apps := object(t, cfg, "apps")
	object(t, apps, "grid")["redis"] = redisURL
	httpApp := object(t, apps, "http")
	httpApp["https_port"] = port
	servers := object(t, httpApp, "servers")
	if len(servers) != 1 {
		t.Fatalf("%s has %d servers, want 1", file, len(servers))
	}
	for _, s := range servers {
		srv := s.(map[string]any)
		srv["listen"] = []string{":" + strconv.Itoa(port)}
		srv["automatic_https"] = map[string]any{"disable_redirects": true}
	}
	logging, _ := cfg["logging"].(map[string]any)
	if logging == nil {
		logging = map[string]any{}
		cfg["logging"] = logging
	}
	logs, _ := logging["logs"].(map[string]any)
	if logs == nil {
		logs = map[string]any{}
		logging["logs"] = logs
	}
	def, _ := logs["default"].(map[string]any)
	if def == nil {
		def = map[string]any{}
		logs["default"] = def
	}
	def["level"] = "DEBUG"
	// The test's own view of what Caddy proxies to the worker: the reverse
	// proxy's debug lines, unfiltered, in a file of their own.
	upstreamLog := filepath.Join(dir, "upstream.log")
	logs["test_upstream"] = map[string]any{
		"writer":  map[string]any{"output": "file", "filename": upstreamLog},
		"encoder": map[string]any{"format": "json"},
		"level":   "DEBUG",
		"include": []string{"http.handlers.reverse_proxy"},
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	env = append(env, "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	s := &recipeServer{
		proc:        testenv.Start(t, env, caddy, "run", "--config", path),
		port:        port,
		upstreamLog: upstreamLog,
		rootCA:      filepath.Join(dir, "storage", "pki", "authorities", "local", "root.crt"),
	}
	// Ready when a TLS handshake for localhost verifies against the
	// internal CA (the certificate is issued after the listener opens).
	testenv.Eventually(t, 30*time.Second, "caddy serving TLS for localhost with its internal CA", func() bool {
		pem, err := os.ReadFile(s.rootCA)
		if err != nil {
			return false
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return false
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.addr(), &tls.Config{ServerName: "localhost", RootCAs: roots})
		if err != nil {
			return false
		}
		c.Close()
		s.roots = roots
		return true
	})
	return s
}

func object(t *testing.T, m map[string]any, key string) map[string]any {
	t.Helper()
	o, ok := m[key].(map[string]any)
	if !ok {
		t.Fatalf("config has no object %q", key)
	}
	return o
}

func (s *recipeServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *recipeServer) url(suffix string) string {
	return fmt.Sprintf("wss://localhost:%d/playwright/chromium%s", s.port, suffix)
}

type sessionResult struct {
	OK    bool   `json:"ok"`
	Title string `json:"title"`
	Error string `json:"error"`
}

// playwright runs one session of playwright/client.mjs: connect, new page,
// setContent, title.
func (s *recipeServer) playwright(t *testing.T, node, suffix, header string) sessionResult {
	return s.playwrightAt(t, node, s.url(suffix), header)
}

// playwrightAt is playwright with the endpoint u (wss:// or https://).
func (s *recipeServer) playwrightAt(t *testing.T, node, u, header string) sessionResult {
	t.Helper()
	args := []string{filepath.Join(testenv.RepoRoot(t), "playwright", "client.mjs"), "run", "--url", u, "--timeout", "20000"}
	if header != "" {
		args = append(args, "--header", header)
	}
	cmd := exec.Command(node, args...)
	cmd.Env = append(os.Environ(), "NODE_EXTRA_CA_CERTS="+s.rootCA)
	out, _ := cmd.CombinedOutput() // the exit code says the same as the session line
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var ev struct {
			Event string `json:"event"`
			sessionResult
		}
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event == "session" {
			return ev.sessionResult
		}
	}
	t.Fatalf("the Playwright client printed no session result:\n%s", out)
	return sessionResult{}
}

// upgradeStatus sends a WebSocket upgrade request and returns the status.
func (s *recipeServer) upgradeStatus(t *testing.T, suffix, header string) int {
	t.Helper()
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: s.roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, s.addr())
		},
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "https"+strings.TrimPrefix(s.url(suffix), "wss"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", base64.StdEncoding.EncodeToString([]byte("0123456789abcdef")))
	if name, value, ok := strings.Cut(header, ":"); ok {
		req.Header.Set(name, strings.TrimSpace(value))
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("upgrade request: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// checkLogs reads what the stopped Caddy wrote: the secret is in no line
// of the recipe's logs (all on Caddy's output), the access log recorded the
// requests, and what Caddy proxied to the worker (the test's upstream log)
// carried neither the client's Authorization header nor the token.
func (s *recipeServer) checkLogs(t *testing.T, secret string, accessLog bool) {
	t.Helper()
	out := s.proc.Output()
	if strings.Contains(out, secret) {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, secret) {
				t.Errorf("the secret is in Caddy's log: %s", line)
			}
		}
	}
	accessed := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Logger  string `json:"logger"`
			Request struct {
				URI string `json:"uri"`
			} `json:"request"`
		}
		if json.Unmarshal(sc.Bytes(), &e) == nil && strings.HasPrefix(e.Logger, "http.log.access") &&
			strings.HasPrefix(e.Request.URI, "/playwright/chromium") {
			accessed++
			if strings.Contains(e.Request.URI, "token") {
				t.Errorf("the access log recorded a token: %s", e.Request.URI)
			}
		}
	}
	// The refused Playwright client, two refused upgrades, the session,
	// the https:// one's discovery and session, and the failed one.
	if accessLog && accessed != 7 {
		t.Errorf("the access log recorded %d requests to /playwright/chromium, want 7", accessed)
	}

	upstream, err := os.ReadFile(s.upstreamLog)
	if err != nil {
		t.Fatalf("reading the upstream log: %v", err)
	}
	proxied := 0
	sc = bufio.NewScanner(strings.NewReader(string(upstream)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Logger  string `json:"logger"`
			Msg     string `json:"msg"`
			Request struct {
				URI     string              `json:"uri"`
				Headers map[string][]string `json:"headers"`
			} `json:"request"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Logger != "http.handlers.reverse_proxy" || e.Msg != "upstream roundtrip" {
			continue
		}
		proxied++
		if _, ok := e.Request.Headers["Authorization"]; ok {
			t.Errorf("the client's Authorization header was proxied to the worker: %s", sc.Text())
		}
		if strings.Contains(e.Request.URI, "token") || strings.Contains(sc.Text(), secret) {
			t.Errorf("the token was proxied to the worker: %s", e.Request.URI)
		}
	}
	if proxied == 0 {
		t.Errorf("no 'upstream roundtrip' line in the upstream log: the check of what reached the worker saw nothing")
	}
}
