package caddygrid_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

// chromiumWith is a site routing chromium (/c/*) with a policy and
// max_concurrent.
func chromiumWith(redisURL, policy string, mc int) caddyOpts {
	return caddyOpts{redisURL: redisURL, site: `
	route /c/* {
		browser_grid chromium {
			policy ` + policy + `
			max_concurrent ` + strconv.Itoa(mc) + `
			select_timeout 1s
		}
	}`}
}

// TestReloadBackToFairShareKeepsLimitsTime: A serves chromium with
// fair_share and max_concurrent 2; B, configured later, with 3, which
// wins. A is reloaded to lifetime_first, then back to fair_share with the
// same options, each time with the same max_concurrent, and claims after
// each reload: only the policy changed, twice, so A's limits keep their
// first time and B's newer 3 stays in force.
func TestReloadBackToFairShareKeepsLimitsTime(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "c1", fake.Behavior{})
	a := startCaddy(t, chromiumWith(g.redis.URL(), "fair_share", 2))
	mustDial(t, a.url("/c/chromium")).close()
	time.Sleep(20 * time.Millisecond)
	b := startCaddy(t, chromiumWith(g.redis.URL(), "lifetime_first", 3))
	mustDial(t, b.url("/c/chromium")).close()
	if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
		t.Fatalf("max_concurrent after B's claim: %d, want B's newer 3", mc)
	}
	a.reload(chromiumWith(g.redis.URL(), "lifetime_first", 2))
	mustDial(t, a.url("/c/chromium")).close()
	if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
		t.Fatalf("max_concurrent after A's switch to lifetime_first: %d, want B's newer 3", mc)
	}
	a.reload(chromiumWith(g.redis.URL(), "fair_share", 2))
	mustDial(t, a.url("/c/chromium")).close()
	if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
		t.Errorf("max_concurrent after A's switch back to fair_share (same options, same limits): %d, want B's newer 3", mc)
	}
}

// TestReloadChangingLimitsWithoutClaimsIsNewest: A serves chromium with
// max_concurrent 2; B, configured later, with 3, which wins. The operator
// reloads A to 4, and, before any chromium client came, to 2 again: A's
// last configuration changed chromium's limits and is the newest, so its 2
// is in force after A's next claim, as it is when a claim came between
// the two reloads. (A config that saw no claim for a pool hands on the
// times it was handed, so the 2 took back its first time, older than B's.)
func TestReloadChangingLimitsWithoutClaimsIsNewest(t *testing.T) {
	for _, claimBetween := range []bool{true, false} {
		t.Run("claim_between_"+strconv.FormatBool(claimBetween), func(t *testing.T) {
			g := newGrid(t)
			g.worker("chromium", "c1", fake.Behavior{})
			a := startCaddy(t, chromiumWith(g.redis.URL(), "lifetime_first", 2))
			mustDial(t, a.url("/c/chromium")).close()
			time.Sleep(20 * time.Millisecond)
			b := startCaddy(t, chromiumWith(g.redis.URL(), "lifetime_first", 3))
			mustDial(t, b.url("/c/chromium")).close()
			if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
				t.Fatalf("max_concurrent after B's claim: %d, want B's newer 3", mc)
			}
			time.Sleep(20 * time.Millisecond)
			a.reload(chromiumWith(g.redis.URL(), "lifetime_first", 4))
			if claimBetween {
				mustDial(t, a.url("/c/chromium")).close()
			}
			a.reload(chromiumWith(g.redis.URL(), "lifetime_first", 2))
			mustDial(t, a.url("/c/chromium")).close()
			if mc := g.limits("chromium").MaxConcurrent; mc != 2 {
				t.Errorf("max_concurrent after A's reloads to 4 then 2 and its claim: %d, want A's newest 2", mc)
			}
		})
	}
}

// chromiumFirefoxWith is a site routing chromium (/c/*) and firefox
// (/f/*) with lifetime_first and their max_concurrent.
func chromiumFirefoxWith(redisURL string, chromium, firefox int) caddyOpts {
	return caddyOpts{redisURL: redisURL, site: `
	route /c/* {
		browser_grid chromium {
			max_concurrent ` + strconv.Itoa(chromium) + `
			select_timeout 1s
		}
	}
	route /f/* {
		browser_grid firefox {
			max_concurrent ` + strconv.Itoa(firefox) + `
			select_timeout 1s
		}
	}`}
}

// TestReloadChangingLimitsWithoutClaimsIsNewestBesideAnotherPool is
// TestReloadChangingLimitsWithoutClaimsIsNewest with a firefox pool that
// keeps max_concurrent 2 throughout: chromium's 2 → 4 → 2 with no chromium
// claim in between is A's newest configuration of chromium whatever other
// pools run under, so A's 2 is in force after its next claim. (The limits
// a config records at provisioning name no pool: firefox's 2 kept the
// chromium 2's first time, older than B's 3, which stayed in force.)
func TestReloadChangingLimitsWithoutClaimsIsNewestBesideAnotherPool(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "c1", fake.Behavior{})
	a := startCaddy(t, chromiumFirefoxWith(g.redis.URL(), 2, 2))
	mustDial(t, a.url("/c/chromium")).close()
	time.Sleep(20 * time.Millisecond)
	b := startCaddy(t, chromiumWith(g.redis.URL(), "lifetime_first", 3))
	mustDial(t, b.url("/c/chromium")).close()
	if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
		t.Fatalf("max_concurrent after B's claim: %d, want B's newer 3", mc)
	}
	time.Sleep(20 * time.Millisecond)
	a.reload(chromiumFirefoxWith(g.redis.URL(), 4, 2))
	a.reload(chromiumFirefoxWith(g.redis.URL(), 2, 2))
	mustDial(t, a.url("/c/chromium")).close()
	if mc := g.limits("chromium").MaxConcurrent; mc != 2 {
		t.Errorf("max_concurrent after A's reloads of chromium to 4 then 2 (firefox 2 throughout) and its claim: %d, want A's newest 2", mc)
	}
}
