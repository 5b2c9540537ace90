package caddygrid_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

// dialAll opens and closes n sessions one after another and returns how
// many were served and the statuses of the refused ones.
func dialAll(t *testing.T, c *caddy, n int) (served int, codes map[int]int, bodies []string) {
	t.Helper()
	codes = map[int]int{}
	for range n {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		if err == nil {
			served++
			s.close()
			continue
		}
		he := refusal(err)
		if he == nil {
			t.Fatal(err)
		}
		codes[he.StatusCode]++
		bodies = append(bodies, string(he.Body))
	}
	return served, codes, bodies
}

// TestOneWorkerRefusingEveryUpgradeWithA4xx: a worker that answers every
// upgrade with 400 (a malicious agent host, or a broken browser server)
// is the one lifetime_first tries first. Its 4xx could be the client's
// doing, so it is not blamed at once; the session tries another worker,
// which accepts the same request: then the refusing worker is the one at
// fault and is marked suspect. Every client is served. (Before, a 4xx went
// straight back to the client and the claim was given back with its
// lifetime: 0 of 20 clients were served while two healthy workers idled.)
func TestOneWorkerRefusingEveryUpgradeWithA4xx(t *testing.T) {
	g := newGrid(t)
	// sorts first: lifetime_first tries workers of equal lifetime in ID order
	bad := g.worker("chromium", "a-refuses", fake.Behavior{Refuse: http.StatusBadRequest})
	g.worker("chromium", "b", fake.Behavior{})
	g.worker("chromium", "c", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	const clients = 20
	served, codes, _ := dialAll(t, c, clients)
	t.Logf("%d well-formed clients: %d served, refused %v; the refusing worker answered %d upgrades",
		clients, served, codes, bad.Stats().Refused)
	if served != clients {
		t.Errorf("%d of %d clients served while two healthy workers were free: one worker answering 400 to every upgrade refused the rest", served, clients)
	}
	// suspect after its first refusal, it is walked past for a while:
	// the other clients never reach it
	if n := bad.Stats().Refused; n < 1 || n > 2 {
		t.Errorf("the refusing worker answered %d upgrades, want 1 (then suspect: walked past)", n)
	}
	if w := g.info("chromium", "a-refuses"); !w.SuspectUntil.After(time.Now()) {
		t.Errorf("the refusing worker is not suspect (until %v) although another worker accepted the request it refused", w.SuspectUntil)
	}
	// a session's slot is released once Caddy sees its socket close, just
	// after the client's close returns: wait for that, then a slot still
	// held is a leak
	ids := []string{"a-refuses", "b", "c"}
	for deadline := time.Now().Add(10 * time.Second); g.activeSum(t, ids...) != 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range ids {
		if w := g.info("chromium", id); w.Active != 0 {
			t.Errorf("%s: %d active after every session ended, want 0", id, w.Active)
		}
	}
	if got := c.metric(`caddy_grid_upgrade_refused_total{code="400",pool="chromium"}`); got < 1 {
		t.Errorf("upgrade_refused_total{code=400} = %v, want the refusal counted", got)
	}
}

// TestEveryWorkerRefusingA4xxBlamesNone: a request every worker refuses
// with the same 4xx (the client's doing: here 403, as Chromium answers an
// Origin it does not allow) is tried on up to dial_retries + 1 workers,
// goes back to the client with that status, and blames no worker: the
// next well-formed client is served at once. With fewer workers than
// attempts the grid answers the 4xx itself, without waiting in the queue
// for select_timeout.
func TestEveryWorkerRefusingA4xxBlamesNone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		workers int
	}{{"more workers than attempts", 4}, {"one worker", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGrid(t)
			var ids []string
			var servers []*fake.Server
			for i := range tc.workers {
				id := string(rune('a' + i))
				ids = append(ids, id)
				servers = append(servers, g.worker("chromium", id, fake.Behavior{Refuse: http.StatusForbidden}))
			}
			c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 20s
		}
	}`})
			start := time.Now()
			const clients = 5
			served, codes, bodies := dialAll(t, c, clients)
			took := time.Since(start)
			asked := 0
			for _, s := range servers {
				asked += int(s.Stats().Refused)
			}
			t.Logf("%d clients: %d served, %v, in %v; workers answered %d upgrades", clients, served, codes, took, asked)
			if served != 0 || codes[http.StatusForbidden] != clients {
				t.Errorf("got %d served and %v, want %d × 403", served, codes, clients)
			}
			if want := clients * min(tc.workers, 3); asked != want {
				t.Errorf("workers answered %d upgrades, want %d (each request on min(workers, dial_retries+1) of them)", asked, want)
			}
			if took > 10*time.Second {
				t.Errorf("%d refused requests took %v: a retry after a 4xx waited in the queue (select_timeout 20s)", clients, took)
			}
			if tc.workers == 1 && !strings.Contains(bodies[0], "403") {
				t.Errorf("the grid's answer %q does not name the status the worker gave", bodies[0])
			}
			for _, id := range ids {
				if w := g.info("chromium", id); w.SuspectUntil.After(time.Now()) || w.Active != 0 || w.Lifetime != 0 {
					t.Errorf("%s: suspect until %v, active %d, lifetime %d; want not suspect, 0, 0: the refusals were the client's", id, w.SuspectUntil, w.Active, w.Lifetime)
				}
			}
		})
	}
}
