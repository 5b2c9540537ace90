package caddygrid_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// An operator reads the pools on Caddy's admin endpoint: every pool with
// its totals, and one pool's workers with what this config brings to it
// (policy and limits). A pool the config names but no worker serves yet
// is shown empty; a pool neither named nor served is 404.
func TestTheAdminAPIShowsPoolsTheirWorkersAndLimits(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	a1, a2 := g.agent("chromium", nil), g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(),
		site: site("max_concurrent 2\n\t\t\tmax_lifetime 10\n\t\t\tmax_session 30s\n\t\t\tselect_timeout 2s")})
	s := mustDial(t, c.url("/playwright/chromium"))
	defer s.close()

	var pools []caddygrid.PoolSummary
	c.adminJSON(http.MethodGet, "/grid/pools", &pools)
	i := slices.IndexFunc(pools, func(p caddygrid.PoolSummary) bool { return p.Pool == "chromium" })
	if i < 0 {
		t.Fatalf("GET /grid/pools has no chromium: %+v", pools)
	}
	if p := pools[i]; p.Workers != 2 || p.Available != 2 || p.Active != 1 || p.Capacity != 4 || p.LocalSessions != 1 {
		t.Errorf("chromium totals %+v, want 2 workers, 2 available, 1 active, capacity 4, 1 local session", p)
	}

	var d caddygrid.PoolDetail
	c.adminJSON(http.MethodGet, "/grid/pools/chromium", &d)
	var ids []string
	for _, w := range d.Workers {
		ids = append(ids, w.ID)
	}
	want := []string{a1.status(t).Browsers[0].ID, a2.status(t).Browsers[0].ID}
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("workers %v, want the agents' %v", ids, want)
	}
	for _, w := range d.Workers {
		if w.Status != "available" || w.Addr == "" || w.HeartbeatAge == "" {
			t.Errorf("worker %+v: want available, with its address and heartbeat age", w)
		}
	}
	conf := d.Configured
	if conf == nil || conf.Policy != "lifetime_first" || conf.MaxConcurrent != 2 || conf.MaxLifetime != 10 ||
		conf.MaxSession != "30s" || conf.SelectTimeout != "2s" || !conf.VersionRouting {
		t.Errorf("configured %+v, want lifetime_first, 2, 10, 30s, 2s, version routing on", conf)
	}

	var empty caddygrid.PoolDetail
	c.adminJSON(http.MethodGet, "/grid/pools/firefox", &empty)
	if empty.Configured == nil || len(empty.Workers) != 0 {
		t.Errorf("firefox (named by the route, no worker): %+v, want its limits and no worker", empty)
	}
	if code, body := c.admin(http.MethodGet, "/grid/pools/opera"); code != http.StatusNotFound {
		t.Errorf("GET /grid/pools/opera: %d %s, want 404", code, body)
	}
}

// An operator lists the live sessions of every instance, of one pool, or
// reads one by its ID (the Grid-Session a client got), with its worker
// and the label the client gave; an unknown ID is 404.
func TestTheAdminAPIListsAndFindsSessions(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	g.agent("firefox", func(c *workeragent.Config) { c.BrowserType = "firefox" })
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	chromium, err := dialHeader(context.Background(), c.url("/playwright/chromium"), http.Header{caddygrid.HeaderLabel: {"checkout test"}})
	if err != nil {
		t.Fatal(err)
	}
	defer chromium.close()
	firefox := mustDial(t, c.url("/playwright/firefox"))
	defer firefox.close()
	cid, fid := chromium.resp.Header.Get(registry.HeaderSession), firefox.resp.Header.Get(registry.HeaderSession)

	var all caddygrid.SessionsPage
	c.adminJSON(http.MethodGet, "/grid/sessions", &all)
	if got := sessionIDs(all); !slices.Equal(got, sorted(cid, fid)) {
		t.Errorf("GET /grid/sessions: %v, want %v", got, sorted(cid, fid))
	}
	var one caddygrid.SessionsPage
	c.adminJSON(http.MethodGet, "/grid/sessions?pool=chromium", &one)
	if got := sessionIDs(one); !slices.Equal(got, []string{cid}) {
		t.Errorf("GET /grid/sessions?pool=chromium: %v, want [%s]", got, cid)
	}

	testenv.Eventually(t, 5*time.Second, "the session is live", func() bool {
		var s caddygrid.SessionOut
		c.adminJSON(http.MethodGet, "/grid/sessions/"+cid, &s)
		return s.State == "live"
	})
	var s caddygrid.SessionOut
	c.adminJSON(http.MethodGet, "/grid/sessions/"+cid, &s)
	if s.Pool != "chromium" || s.Worker != g.sessionOf("chromium", chromium).Worker || s.Label != "checkout test" || s.Instance == "" {
		t.Errorf("GET /grid/sessions/%s: %+v, want its pool, worker, label and instance", cid, s)
	}
	if code, body := c.admin(http.MethodGet, "/grid/sessions/nosuchsession"); code != http.StatusNotFound {
		t.Errorf("an unknown session: %d %s, want 404", code, body)
	}
}

// An operator ends a live session by its ID: the client reads a close
// frame within a second whose reason says the operator ended it, the
// slot is free, and ending it again is 404.
func TestTheAdminAPIEndsASessionWithACloseFrame(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	s := mustDial(t, c.url("/playwright/chromium"))
	other := mustDial(t, c.url("/playwright/chromium"))
	defer other.close()
	id := s.resp.Header.Get(registry.HeaderSession)

	got := make(chan error, 1)
	var code websocket.StatusCode
	var reason string
	var took time.Duration
	go func() {
		var err error
		code, reason, took, err = s.closed(5 * time.Second)
		got <- err
	}()
	if code, body := c.admin(http.MethodDelete, "/grid/sessions/"+id); code != http.StatusOK {
		t.Fatalf("DELETE /grid/sessions/%s: %d %s", id, code, body)
	}
	if err := <-got; err != nil {
		t.Fatalf("the session ended without a close frame: %v", err)
	}
	if took > time.Second {
		t.Errorf("the close frame came after %s, want within 1s", took)
	}
	if code != websocket.StatusNormalClosure || !strings.Contains(reason, "operator") {
		t.Errorf("close %d %q, want %d saying the operator ended it", code, reason, websocket.StatusNormalClosure)
	}
	testenv.Eventually(t, 5*time.Second, "the session is gone from Redis", func() bool {
		_, ok, _ := g.reg.GetSession(context.Background(), "chromium", id)
		return !ok
	})
	if code, body := c.admin(http.MethodDelete, "/grid/sessions/"+id); code != http.StatusNotFound {
		t.Errorf("a second DELETE: %d %s, want 404", code, body)
	}
	if err := other.echo("untouched"); err != nil {
		t.Errorf("the other session broke: %v", err)
	}
}

// An operator drains a worker: it takes no new session from then on (the
// next goes to its replacement, a new worker ID), its live session goes
// on to its end, and it then leaves the registry. Draining a worker that
// is not registered is 404.
func TestTheAdminAPIDrainsAWorker(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	ag := g.agent("chromium", func(c *workeragent.Config) { c.Respawn = true })
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 4")})
	s := mustDial(t, c.url("/playwright/chromium"))
	old := g.sessionOf("chromium", s).Worker

	if code, body := c.admin(http.MethodPost, "/grid/pools/chromium/workers/"+old+"/drain"); code != http.StatusOK {
		t.Fatalf("drain: %d %s", code, body)
	}
	next := mustDial(t, c.url("/playwright/chromium"))
	defer next.close()
	if w := g.sessionOf("chromium", next).Worker; w == old {
		t.Errorf("a session after the drain went to the drained worker %s", old)
	}
	if err := s.echo("still here"); err != nil {
		t.Errorf("the drained worker's live session broke: %v", err)
	}
	for _, b := range ag.status(t).Browsers {
		if b.ID == old && b.Lifetime != 1 {
			t.Errorf("the drained worker served %d sessions, want 1", b.Lifetime)
		}
	}
	s.close()
	testenv.Eventually(t, 10*time.Second, "the drained worker leaves the registry", func() bool {
		_, ok := g.worker("chromium", old)
		return !ok
	})
	if code, body := c.admin(http.MethodPost, "/grid/pools/chromium/workers/nosuchworker/drain"); code != http.StatusNotFound {
		t.Errorf("draining an unknown worker: %d %s, want 404", code, body)
	}
}

func sessionIDs(p caddygrid.SessionsPage) []string {
	var out []string
	for _, s := range p.Sessions {
		out = append(out, s.ID)
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// A session's entry says how long it has carried no data frame, as its
// agent's heartbeats report it: it grows while the client is quiet and
// starts again from zero after a frame.
func TestTheAdminAPIShowsHowLongASessionHasBeenIdle(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	s := mustDial(t, c.url("/playwright/chromium"))
	defer s.close()
	id := s.resp.Header.Get(registry.HeaderSession)
	idle := func() time.Duration {
		var out caddygrid.SessionOut
		c.adminJSON(http.MethodGet, "/grid/sessions/"+id, &out)
		return time.Duration(out.IdleMS) * time.Millisecond
	}
	testenv.Eventually(t, 10*time.Second, "the quiet session is shown idle 2s or more", func() bool { return idle() >= 2*time.Second })
	if err := s.echo("awake"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "after a frame, idle under 1s", func() bool { return idle() < time.Second })
}
