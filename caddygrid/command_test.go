package caddygrid_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// An operator runs 'caddy grid' against the running Caddy's admin
// address: status prints each pool with its workers and limits, sessions
// lists the live sessions with their labels, end closes one (the client
// reads the operator's close frame), drain retires a worker; each exits 0.
func TestTheGridCommandShowsAndControlsTheGrid(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	ag := g.agent("chromium", func(c *workeragent.Config) { c.Respawn = true })
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 3\n\t\t\tmax_lifetime 50")})
	s, err := dialHeader(t.Context(), c.url("/playwright/chromium"), http.Header{caddygrid.HeaderLabel: {"login flow"}})
	if err != nil {
		t.Fatal(err)
	}
	id := s.resp.Header.Get(registry.HeaderSession)
	worker := ag.status(t).Browsers[0].ID
	addr := "--address=" + c.adminAddr()

	code, out := c.command("grid", "status", addr)
	if code != 0 || !strings.Contains(out, "pool chromium") || !strings.Contains(out, worker) ||
		!strings.Contains(out, "max_lifetime 50") || !strings.Contains(out, "1/50") {
		t.Errorf("grid status: exit %d, want 0 and the pool, its worker, max_lifetime and lifetime 1/50:\n%s", code, out)
	}
	code, out = c.command("grid", "status", "--pool", "chromium", addr)
	if code != 0 || !strings.Contains(out, worker) {
		t.Errorf("grid status --pool chromium: exit %d:\n%s", code, out)
	}
	code, out = c.command("grid", "sessions", addr)
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "login flow") || !strings.Contains(out, worker) {
		t.Errorf("grid sessions: exit %d, want the session %s with its label and worker:\n%s", code, id, out)
	}

	closed := make(chan string, 1)
	go func() {
		_, reason, _, err := s.closed(5 * time.Second)
		if err != nil {
			reason = err.Error()
		}
		closed <- reason
	}()
	code, out = c.command("grid", "end", id, addr)
	if code != 0 || !strings.Contains(out, id) {
		t.Errorf("grid end: exit %d:\n%s", code, out)
	}
	if reason := <-closed; !strings.Contains(reason, "operator") {
		t.Errorf("the ended session's close reason %q does not say the operator ended it", reason)
	}

	code, out = c.command("grid", "drain", "chromium", worker, addr)
	if code != 0 || !strings.Contains(out, worker) {
		t.Errorf("grid drain: exit %d:\n%s", code, out)
	}
	testenv.Eventually(t, 10*time.Second, "the drained worker is replaced", func() bool {
		_, ok := g.worker("chromium", worker)
		return !ok && len(g.workers("chromium")) == 1
	})
	code, out = c.command("grid", "sessions", addr)
	if code != 0 || !strings.Contains(out, "no live sessions") {
		t.Errorf("grid sessions with none: exit %d:\n%s", code, out)
	}
}

// 'caddy grid' given a bad argument (a missing one, a session or worker
// that does not exist, a name that is no pool, an unknown subcommand)
// exits non-zero with a message saying what is wrong.
func TestTheGridCommandRefusesBadArguments(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	addr := "--address=" + c.adminAddr()
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"grid", "end", addr}, "arg"},
		{[]string{"grid", "end", "nosuchsession", addr}, "no session"},
		{[]string{"grid", "drain", "chromium", addr}, "arg"},
		{[]string{"grid", "drain", "chromium", "nosuchworker", addr}, "not registered"},
		{[]string{"grid", "drain", "a b", "w", addr}, "invalid pool name"},
		{[]string{"grid", "status", "--pool", "a b", addr}, "invalid pool name"},
		{[]string{"grid", "status", "--pool", "opera", addr}, "opera"},
		{[]string{"grid", "status", "--interval", "0s", addr}, "interval"},
		{[]string{"grid", "sessions", "--pool", "a b", addr}, "invalid pool name"},
		{[]string{"grid", "status", "extra", addr}, "unknown command"},
		{[]string{"grid", "status", "--address=127.0.0.1:1"}, "127.0.0.1:1"},
	} {
		code, out := c.command(tc.args...)
		if code == 0 || !strings.Contains(out, tc.says) {
			t.Errorf("caddy %s: exit %d, want non-zero with a message containing %q:\n%s",
				strings.Join(tc.args, " "), code, tc.says, out)
		}
	}
}
