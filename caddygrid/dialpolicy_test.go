package caddygrid_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// listeningWorker is a fakebrowser on a listener that counts every
// connection made to it, so a test can prove nobody dialed it.
type listeningWorker struct {
	srv  *fake.Server
	l    *countingListener
	addr string // what the worker would advertise
}

func startListeningWorker(t *testing.T, network, address string) *listeningWorker {
	t.Helper()
	l, err := net.Listen(network, address)
	if err != nil {
		t.Fatalf("listening on %s %s: %v", network, address, err)
	}
	cl := &countingListener{Listener: l}
	srv := fake.New(fake.Options{Path: "/playwright"})
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })
	addr := l.Addr().String()
	if network == "unix" {
		addr = "unix/" + addr
	}
	return &listeningWorker{srv: srv, l: cl, addr: addr}
}

// registerAt writes a worker record as an agent (or a Redis writer) would.
func (g *grid) registerAt(id, addr, path string, secret []byte) {
	g.t.Helper()
	err := g.reg.Register(context.Background(), registry.Registration{
		Pool: "chromium", ID: id, BrowserType: "chromium", Addr: addr, Path: path, TTL: workerTTL, Secret: secret,
	})
	if err != nil {
		g.t.Fatalf("registering %s: %v", id, err)
	}
}

// honestID sorts after every rogue record's ID: lifetime-first tries
// workers of equal lifetime in ID order, so the first client's claims
// land on every rogue record before the honest worker.
const honestID = "zz-honest"

// serveAroundRogues drives clients through a grid whose only honest worker
// takes one session at a time (max_concurrent 1) next to rogues rogue
// records. Client A's claims land on each rogue record first, each is
// refused, and A is served by the honest worker in the same request; A
// holds it, so client B finds no allowed worker (503 at select_timeout);
// then A leaves and `more` clients are served one after another. It
// returns the sessions the honest worker served.
func serveAroundRogues(t *testing.T, g *grid, c *caddy, honest *listeningWorker, rogues, more int) int64 {
	t.Helper()
	a := mustDial(t, c.url("/playwright/chromium"))
	refused := 0.0
	for _, reason := range []string{"outside_worker_networks", "unix_socket", "bad_path", "unsigned", "bad_signature"} {
		refused += c.metric(fmt.Sprintf(`caddy_grid_bad_records_total{pool="chromium",reason=%q}`, reason))
	}
	if refused != float64(rogues) {
		t.Errorf("client A's request refused %v records before it was served, want all %d rogue records", refused, rogues)
	}
	b, err := dial(context.Background(), c.url("/playwright/chromium"))
	if err == nil {
		t.Errorf("client B got a session while the only allowed worker was busy: a rogue record served it")
		b.close()
	} else if he := refusal(err); he == nil || he.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("client B while the honest worker is busy: got %v, want 503 (no allowed worker)", err)
	}
	a.close()
	for i := range more {
		// Wait for the release in Redis: a claim that finds the worker
		// still busy would wait in the queue for the next wake-up.
		testenv.Eventually(t, 10*time.Second, "the honest worker's claim released", func() bool {
			return g.info("chromium", honestID).Active == 0
		})
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		if err != nil {
			t.Fatalf("client %d after the rogues were refused: %v", i, err)
		}
		s.close()
	}
	t.Logf("sessions served by the allowed worker: %d", honest.srv.Stats().Sessions)
	return honest.srv.Stats().Sessions
}

// badRecordIDs reads GET /grid/pools/chromium's bad_records.
func badRecordIDs(t *testing.T, c *caddy) map[string]string {
	t.Helper()
	code, body := c.admin(http.MethodGet, "/grid/pools/chromium")
	if code != http.StatusOK {
		t.Fatalf("GET /grid/pools/chromium: %d %s", code, body)
	}
	var d caddygrid.PoolDetail
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	out := map[string]string{}
	for _, b := range d.BadRecords {
		out[b.ID] = b.Error
	}
	return out
}

// TestRogueRecordsAreNeverDialed: with worker_networks 127.0.0.2/32, a
// record advertising 127.0.0.1 (outside), one advertising a unix socket
// and one whose path climbs out with an encoded '..' are never dialed:
// their listeners accept no connection, while clients are served by the
// honest worker. Each refusal is reported: the bad-record metric by
// reason, a log line with the worker ID, and the admin API's bad_records.
func TestRogueRecordsAreNeverDialed(t *testing.T) {
	g := newGrid(t)
	honest := startListeningWorker(t, "tcp", "127.0.0.2:0")
	rogue := startListeningWorker(t, "tcp", "127.0.0.1:0")
	unix := startListeningWorker(t, "unix", filepath.Join(t.TempDir(), "internal.sock"))
	dotdot := startListeningWorker(t, "tcp", "127.0.0.2:0")
	g.registerAt(honestID, honest.addr, "/playwright", nil)
	g.registerAt("rogue", rogue.addr, "/playwright", nil)
	g.registerAt("unix", unix.addr, "/playwright", nil)
	g.registerAt("dotdot", dotdot.addr, "/playwright/%2e%2e/internal/admin", nil)

	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), global: "worker_networks 127.0.0.2/32", site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 1s
		}
	}`})
	const more = 5
	served := serveAroundRogues(t, g, c, honest, 3, more)

	for name, w := range map[string]*listeningWorker{"rogue": rogue, "unix": unix, "dotdot": dotdot} {
		t.Logf("%s record's listener: %d connections", name, w.l.accepted.Load())
		if n := w.l.accepted.Load(); n != 0 {
			t.Errorf("%s record's listener accepted %d connections, want 0", name, n)
		}
	}
	if served != 1+more {
		t.Errorf("the honest worker served %d sessions, want %d", served, 1+more)
	}
	for reason, want := range map[string]float64{"outside_worker_networks": 1, "unix_socket": 1, "bad_path": 1} {
		got := c.metric(fmt.Sprintf(`caddy_grid_bad_records_total{pool="chromium",reason=%q}`, reason))
		if got != want {
			t.Errorf("bad_records_total{reason=%q} = %v, want %v (each rogue refused once, then suspect)", reason, got, want)
		}
	}
	bad := badRecordIDs(t, c)
	for id, reason := range map[string]string{"rogue": "outside_worker_networks", "unix": "unix_socket", "dotdot": "bad_path"} {
		if !strings.HasPrefix(bad[id], reason) {
			t.Errorf("admin bad_records[%s] = %q, want it to start with %q", id, bad[id], reason)
		}
		if !strings.Contains(c.proc.Output(), `"worker_id":"`+id+`"`) {
			t.Errorf("no log line names worker %s", id)
		}
	}
	if _, ok := bad[honestID]; ok {
		t.Errorf("the honest worker is listed as a bad record: %q", bad[honestID])
	}
	for _, id := range []string{"rogue", "unix", "dotdot"} {
		if w := g.info("chromium", id); w.Active != 0 || w.Lifetime != 0 || !w.SuspectUntil.After(time.Now()) {
			t.Errorf("refused record %s: active %d, lifetime %d, suspect until %v; want 0, 0, in the future",
				id, w.Active, w.Lifetime, w.SuspectUntil)
		}
	}
}

// TestSignedRegistrations: with worker_secret set, a record signed with
// another secret, an unsigned one, and a signed record a Redis writer
// pointed at its own listener are never dialed; the record signed with
// the secret serves every client.
func TestSignedRegistrations(t *testing.T) {
	const secret = "grid-test-secret"
	t.Setenv("GRID_WORKER_SECRET", secret)
	g := newGrid(t)
	honest := startListeningWorker(t, "tcp", "127.0.0.1:0")
	forged := startListeningWorker(t, "tcp", "127.0.0.1:0")
	unsigned := startListeningWorker(t, "tcp", "127.0.0.1:0")
	moved := startListeningWorker(t, "tcp", "127.0.0.1:0")
	g.registerAt(honestID, honest.addr, "/playwright", []byte(secret))
	g.registerAt("forged", forged.addr, "/playwright", []byte("a guess"))
	g.registerAt("unsigned", unsigned.addr, "/playwright", nil)
	// "moved" was registered by its agent with the secret; a Redis writer
	// then points the record at its own listener, signature unchanged.
	g.registerAt("moved", "127.0.0.1:9", "/playwright", []byte(secret))
	key := g.reg.Key("chromium", "workers")
	raw, err := g.rdb.HGet(context.Background(), key, "moved").Result()
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		t.Fatal(err)
	}
	rec["addr"] = moved.addr
	b, _ := json.Marshal(rec)
	if err := g.rdb.HSet(context.Background(), key, "moved", b).Err(); err != nil {
		t.Fatal(err)
	}

	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), global: "worker_secret {env.GRID_WORKER_SECRET}", site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 1s
		}
	}`})
	const more = 5
	served := serveAroundRogues(t, g, c, honest, 3, more)
	for name, w := range map[string]*listeningWorker{"forged": forged, "unsigned": unsigned, "moved": moved} {
		t.Logf("%s record's listener: %d connections", name, w.l.accepted.Load())
		if n := w.l.accepted.Load(); n != 0 {
			t.Errorf("%s record's listener accepted %d connections, want 0", name, n)
		}
	}
	if served != 1+more {
		t.Errorf("the signed worker served %d sessions, want %d", served, 1+more)
	}
	for reason, want := range map[string]float64{"bad_signature": 2, "unsigned": 1} {
		got := c.metric(fmt.Sprintf(`caddy_grid_bad_records_total{pool="chromium",reason=%q}`, reason))
		if got != want {
			t.Errorf("bad_records_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	bad := badRecordIDs(t, c)
	for id, reason := range map[string]string{"forged": "bad_signature", "unsigned": "unsigned", "moved": "bad_signature"} {
		if !strings.HasPrefix(bad[id], reason) {
			t.Errorf("admin bad_records[%s] = %q, want it to start with %q", id, bad[id], reason)
		}
	}
	if strings.Contains(c.proc.Output(), secret) {
		t.Error("Caddy's output holds the worker secret")
	}
}

// A record whose address serves plain HTTP (a 200 page, not a browser)
// is blamed and skipped; when the tries run out on such records, the
// client gets a 502 that says so, not the page's 200 with its body dropped (a success
// a client cannot tell from one), and nothing of the page.
func TestAWorkerAnsweringWithAPageGets502(t *testing.T) {
	g := newGrid(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Internal", "page")
		_, _ = io.WriteString(w, "an internal page")
	}))
	t.Cleanup(page.Close)
	for _, retries := range []int{0, 2} {
		// one record per try, each tried once (a blamed record is
		// suspect a while): the tries run out on pages
		for i := range retries + 1 {
			g.registerAt(fmt.Sprintf("page-%d-%d", retries, i), strings.TrimPrefix(page.URL, "http://"), "/internal", nil)
		}
		c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	route /playwright/* {
		browser_grid chromium {
			select_timeout 300ms
			dial_retries %d
		}
	}`, retries)})
		_, err := dial(context.Background(), c.url("/playwright/chromium"))
		he := refusal(err)
		if he == nil || he.StatusCode != http.StatusBadGateway || he.Header.Get("X-Internal") != "" ||
			strings.Contains(string(he.Body), "internal page") {
			t.Errorf("dial_retries %d: %v, want a 502 of Caddy's own", retries, err)
		}
	}
}

// An instance whose worker_networks leave a worker out (a config another
// instance, or this one after a reload, does not share: a rollout, a
// mistake rolled back) refuses its record; the mark that keeps every
// instance off it lasts as long as a failed dial's, not a minute, so an
// instance that allows the worker serves it again within seconds.
func TestAnotherInstancesRefusalPassesSoon(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	site := `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 300ms
		}
	}`
	narrow := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), global: "worker_networks 10.20.0.0/16", site: site})
	wide := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site})
	if _, err := dial(context.Background(), narrow.url("/playwright/chromium")); refusal(err) == nil {
		t.Fatalf("through the narrow instance: %v, want a refusal (its only worker is outside worker_networks)", err)
	}
	refused := time.Now()
	testenv.Eventually(t, 20*time.Second, "the other instance serves the worker again", func() bool {
		s, err := dial(context.Background(), wide.url("/playwright/chromium"))
		if err != nil {
			return false
		}
		s.close()
		return true
	})
	if d := time.Since(refused); d > 10*time.Second {
		t.Errorf("the other instance served the worker %s after the refusal, want within a failed dial's mark (5s)", d.Round(100*time.Millisecond))
	}
}
