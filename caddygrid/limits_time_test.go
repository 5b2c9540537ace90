package caddygrid_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

// twoPools is a site routing chromium (/c/*) and firefox (/f/*), each
// with its own max_concurrent.
func twoPools(redisURL string, chromium, firefox int, extra string) caddyOpts {
	return caddyOpts{redisURL: redisURL, site: `
	route /c/* {
		browser_grid chromium {
			max_concurrent ` + strconv.Itoa(chromium) + `
			select_timeout 1s` + extra + `
		}
	}
	route /f/* {
		browser_grid firefox {
			max_concurrent ` + strconv.Itoa(firefox) + `
			select_timeout 1s
		}
	}`}
}

// TestReloadKeepsIdlePoolsLimitsTime: instance A serves chromium and
// firefox (firefox max_concurrent 3); instance B, configured later, serves
// firefox with 2, which wins (newest configuration). A is then reloaded
// twice for reasons unrelated to firefox, with only chromium traffic in
// between. Its firefox limits are unchanged, so they must keep their first
// time ("a reload that keeps them keeps their time") and B's newer 2 must
// stay in force. (A config hands on only the times of the limits it
// claimed with, so firefox's time was lost after a config that claimed for
// chromium only: A's next firefox claim carried the second reload's time,
// newer than B's, and put A's older 3 back in force.)
func TestReloadKeepsIdlePoolsLimitsTime(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "c1", fake.Behavior{})
	g.worker("firefox", "f1", fake.Behavior{})
	a := startCaddy(t, twoPools(g.redis.URL(), 1, 3, ""))
	mustDial(t, a.url("/c/chromium")).close()
	mustDial(t, a.url("/f/firefox")).close()
	time.Sleep(20 * time.Millisecond) // B's configuration is newer by more than a millisecond
	b := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /f/* {
		browser_grid firefox {
			max_concurrent 2
			select_timeout 1s
		}
	}`})
	mustDial(t, b.url("/f/firefox")).close()
	if mc := g.limits("firefox").MaxConcurrent; mc != 2 {
		t.Fatalf("firefox max_concurrent after B's claim: %d, want B's newer 2", mc)
	}

	// Two reloads of A that change nothing of firefox's (chromium's
	// select_timeout), chromium traffic only in between.
	a.reload(twoPools(g.redis.URL(), 1, 3, "\n\t\t\tqueue_size 50"))
	mustDial(t, a.url("/c/chromium")).close()
	a.reload(twoPools(g.redis.URL(), 1, 3, "\n\t\t\tqueue_size 60"))
	mustDial(t, a.url("/f/firefox")).close()
	if mc := g.limits("firefox").MaxConcurrent; mc != 2 {
		t.Errorf("firefox max_concurrent after A's claim following two unrelated reloads: %d, want B's newer 2 (A's firefox limits are older)", mc)
	}
}

// TestReloadToLimitsOfAnotherPoolIsNewest: instance A serves chromium
// (max_concurrent 2) and firefox (3); instance B, configured later, serves
// firefox with 4, which wins. The operator then reloads A with firefox 2:
// A's configuration is now the newest for firefox, so its 2 must be in
// force after A's next firefox claim. (The time was kept per set of
// limits, not per pool: firefox's new 2 took the time chromium's 2 had
// since A started, older than B's, and B's 4 stayed in force.)
func TestReloadToLimitsOfAnotherPoolIsNewest(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "c1", fake.Behavior{})
	g.worker("firefox", "f1", fake.Behavior{})
	a := startCaddy(t, twoPools(g.redis.URL(), 2, 3, ""))
	mustDial(t, a.url("/c/chromium")).close()
	mustDial(t, a.url("/f/firefox")).close()
	time.Sleep(20 * time.Millisecond)
	b := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /f/* {
		browser_grid firefox {
			max_concurrent 4
			select_timeout 1s
		}
	}`})
	mustDial(t, b.url("/f/firefox")).close()
	if mc := g.limits("firefox").MaxConcurrent; mc != 4 {
		t.Fatalf("firefox max_concurrent after B's claim: %d, want B's newer 4", mc)
	}
	time.Sleep(20 * time.Millisecond) // A's reload is newer than B's by more than a millisecond
	a.reload(twoPools(g.redis.URL(), 2, 2, ""))
	mustDial(t, a.url("/f/firefox")).close()
	if mc := g.limits("firefox").MaxConcurrent; mc != 2 {
		t.Errorf("firefox max_concurrent after A's reload to 2 and its claim: %d, want A's newest 2", mc)
	}
}

// TestReloadSwitchingPolicyKeepsLimitsTime: instance A serves chromium
// with one policy and max_concurrent 2; instance B, configured later,
// with 3, which wins. A is then reloaded to another policy with the same
// max_concurrent, max_lifetime and stagger_drains. The policy is not one
// of the limits the pool stores, so A's limits keep their time and B's
// newer 3 stays in force after A's next claim. (The time was kept per
// policy too: the switch made A's older 2 the newest configuration.) From
// fair_share, whose options only its own claims bring, to another policy
// the limits are unchanged as well.
func TestReloadSwitchingPolicyKeepsLimitsTime(t *testing.T) {
	for _, sw := range [][2]string{{"lifetime_first", "vnode"}, {"fair_share", "lifetime_first"}} {
		t.Run(sw[0]+"_to_"+sw[1], func(t *testing.T) {
			g := newGrid(t)
			g.worker("chromium", "c1", fake.Behavior{})
			config := func(policy string) caddyOpts {
				return caddyOpts{redisURL: g.redis.URL(), site: `
	route /c/* {
		browser_grid chromium {
			policy ` + policy + `
			max_concurrent 2
			select_timeout 1s
		}
	}`}
			}
			a := startCaddy(t, config(sw[0]))
			mustDial(t, a.url("/c/chromium")).close()
			time.Sleep(20 * time.Millisecond)
			b := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /c/* {
		browser_grid chromium {
			max_concurrent 3
			select_timeout 1s
		}
	}`})
			mustDial(t, b.url("/c/chromium")).close()
			if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
				t.Fatalf("max_concurrent after B's claim: %d, want B's newer 3", mc)
			}
			a.reload(config(sw[1]))
			mustDial(t, a.url("/c/chromium")).close()
			if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
				t.Errorf("max_concurrent after A's claim following its switch to %s: %d, want B's newer 3 (A's limits are unchanged and older)", sw[1], mc)
			}
		})
	}
}
