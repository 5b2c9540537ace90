package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// A worker's active count is what claims admit by (a worker is claimable
// while active < its cap), and claims and releases move it by one
// (HINCRBY) rather than counting its leases each time. It must therefore
// equal, after every script, the number of lease_owner entries of the
// worker's current generation: one below, and a claim admits a session
// past the cap.

// activeDrift lists, for every worker with a record in pool, the ones
// whose stored active count differs from their generation's lease_owner
// entries, and every lease without its owner entry (or entry without its
// lease).
func activeDrift(ctx context.Context, r *Registry, rdb redis.UniversalClient, pool string) ([]string, error) {
	recs, err := rdb.HGetAll(ctx, r.Key(pool, keyWorkers)).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for id, raw := range recs {
		var rec struct {
			Gen string `json:"gen"`
		}
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			return nil, fmt.Errorf("record of %s: %w", id, err)
		}
		active, err := rdb.HGet(ctx, r.Key(pool, keyActive), id).Int()
		if err != nil {
			return nil, fmt.Errorf("active of %s: %w", id, err)
		}
		n, err := rdb.ZLexCount(ctx, r.Key(pool, keyLeaseOwner), "["+id+" "+rec.Gen+" ", "("+id+" "+rec.Gen+"!").Result()
		if err != nil {
			return nil, err
		}
		if int64(active) != n {
			out = append(out, fmt.Sprintf("%s (gen %s): active %d, %d leases of its generation", id, rec.Gen, active, n))
		}
	}
	leases, err := rdb.HGetAll(ctx, r.Key(pool, keyLeases)).Result()
	if err != nil {
		return nil, err
	}
	owners, err := rdb.ZRange(ctx, r.Key(pool, keyLeaseOwner), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for lid, raw := range leases {
		if isTombstone(raw) {
			continue
		}
		var l struct{ Worker, Gen string }
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			return nil, fmt.Errorf("lease %s: %w", lid, err)
		}
		want[l.Worker+" "+l.Gen+" "+lid] = true
	}
	for _, m := range owners {
		if !want[m] {
			out = append(out, "lease_owner entry of no lease: "+m)
		}
		delete(want, m)
	}
	for m := range want {
		out = append(out, "lease without its lease_owner entry: "+m)
	}
	return out, nil
}

// countWalk drives a pool's scripts through a seeded random sequence of the
// paths that add or remove leases or rewrite a worker's count, checking
// activeDrift after every step.
type countWalk struct {
	t     *testing.T
	ctx   context.Context
	r     *Registry
	rdb   redis.UniversalClient
	rng   *rand.Rand
	pools []string
	ids   []string
	caps  map[string]int
	gens  map[string]string // pool+" "+id -> generation registered last
	// leases ever claimed or cancelled (live or not), by pool
	known []walkLease
	steps []string
}

type walkLease struct {
	pool, id string
	claim    *Claim // nil: cancelled before any claim
}

func (w *countWalk) step(format string, args ...any) {
	w.steps = append(w.steps, fmt.Sprintf(format, args...))
}

func (w *countWalk) fail(format string, args ...any) {
	w.t.Helper()
	from := max(0, len(w.steps)-25)
	w.t.Fatalf("%s\nlast steps:\n  %s", fmt.Sprintf(format, args...), strings.Join(w.steps[from:], "\n  "))
}

func (w *countWalk) check() {
	w.t.Helper()
	for _, p := range w.pools {
		bad, err := activeDrift(w.ctx, w.r, w.rdb, p)
		if err != nil {
			w.fail("reading pool %s: %v", p, err)
		}
		if len(bad) > 0 {
			w.fail("pool %s: counts apart from the leases:\n  %s", p, strings.Join(bad, "\n  "))
		}
	}
}

func (w *countWalk) register(pool, id, gen string) {
	w.t.Helper()
	was := "none"
	if wi, err := w.r.Worker(w.ctx, pool, id); err == nil {
		was = wi.gen
	} else if !errors.Is(err, ErrNotRegistered) {
		was = err.Error()
	}
	w.step("register %s/%s gen %s (stored: %s)", pool, id, gen, was)
	err := w.r.Register(w.ctx, Registration{Pool: pool, ID: id, BrowserType: "chromium", Addr: "127.0.0.1:1",
		Path: "/", Capacity: w.caps[id], TTL: time.Hour, Generation: gen})
	if err != nil {
		w.fail("registering %s/%s gen %s: %v", pool, id, gen, err)
	}
	w.gens[pool+" "+id] = gen
}

func (w *countWalk) claim(pool, lid, client string) {
	w.t.Helper()
	req := ClaimRequest{Pool: pool, Policy: LifetimeFirst, LeaseTTL: time.Hour, LeaseID: lid,
		Limits: selection.Limits{MaxLifetime: 40, StaleAfter: time.Hour}}
	if client != "" {
		req.ClientKey, req.ClientLimit = client, 3
	}
	c, err := w.r.Claim(w.ctx, req)
	var lim *ClientLimitError
	switch {
	case err == nil:
		w.step("claim %s/%s (client %q) -> %s, active %d", pool, lid, client, c.Worker.ID, c.Worker.Active)
		w.known = append(w.known, walkLease{pool: pool, id: c.LeaseID, claim: c})
	case errors.Is(err, ErrNoWorker), errors.Is(err, ErrClaimCancelled), errors.As(err, &lim):
		w.step("claim %s/%s (client %q) -> %v", pool, lid, client, err)
	default:
		w.fail("claim %s/%s: %v", pool, lid, err)
	}
}

func (w *countWalk) pick() (walkLease, bool) {
	if len(w.known) == 0 {
		return walkLease{}, false
	}
	return w.known[w.rng.IntN(len(w.known))], true
}

func (w *countWalk) run(n int) {
	w.t.Helper()
	for _, p := range w.pools {
		for _, id := range w.ids {
			w.register(p, id, "g1")
		}
	}
	w.check()
	clients := []string{"", "", "alice", "bob"}
	for range n {
		pool := w.pools[w.rng.IntN(len(w.pools))]
		id := w.ids[w.rng.IntN(len(w.ids))]
		switch x := w.rng.IntN(100); {
		case x < 30: // a new claim
			w.claim(pool, NewLeaseID(), clients[w.rng.IntN(len(clients))])
		case x < 36: // the same claim again (a retry, a replay, a late claim after a cancel)
			if l, ok := w.pick(); ok {
				client := ""
				if l.claim != nil && l.claim.Client != "" {
					client = clients[2+w.rng.IntN(2)]
				}
				w.claim(l.pool, l.id, client)
			}
		case x < 50:
			if l, ok := w.pick(); ok {
				w.step("release %s/%s", l.pool, l.id)
				if err := w.r.Release(w.ctx, l.pool, l.id); err != nil {
					w.fail("release: %v", err)
				}
			}
		case x < 55:
			if l, ok := w.pick(); ok {
				w.step("undo %s/%s", l.pool, l.id)
				if err := w.r.Undo(w.ctx, l.pool, l.id, 0); err != nil {
					w.fail("undo: %v", err)
				}
			}
		case x < 59: // a cancel, of a claim not run yet (it runs late, maybe) or of a live one
			lid := NewLeaseID()
			if l, ok := w.pick(); ok && w.rng.IntN(2) == 0 {
				pool, lid = l.pool, l.id
			} else {
				w.known = append(w.known, walkLease{pool: pool, id: lid})
			}
			w.step("cancel %s/%s", pool, lid)
			if err := w.r.Cancel(w.ctx, pool, lid); err != nil {
				w.fail("cancel: %v", err)
			}
		case x < 69: // a lease's holder stops renewing: its expiry passes, a sweep frees it
			if l, ok := w.pick(); ok {
				w.step("lease %s/%s expires", l.pool, l.id)
				if err := w.rdb.ZAddXX(w.ctx, w.r.Key(l.pool, keyLeaseExpiry), redis.Z{Score: 1, Member: l.id}).Err(); err != nil {
					w.fail("ageing a lease: %v", err)
				}
				switch w.rng.IntN(3) {
				case 0:
					if _, err := w.r.ExpireLeases(w.ctx, l.pool, 100); err != nil {
						w.fail("expiring leases: %v", err)
					}
				case 1:
					if _, err := w.r.Heartbeat(w.ctx, l.pool, id, time.Hour); err != nil && !errors.Is(err, ErrNotRegistered) {
						w.fail("heartbeat: %v", err)
					}
				default:
					w.claim(l.pool, NewLeaseID(), "")
				}
			}
		case x < 79: // a holder renews what it holds (ended, expired or lost leases among them)
			var rs []LeaseRenewal
			for range 1 + w.rng.IntN(4) {
				if l, ok := w.pick(); ok && l.claim != nil && l.pool == pool {
					rs = append(rs, LeaseRenewal{ID: l.id, Worker: l.claim.Worker.ID, Gen: l.claim.Gen,
						Claimed: time.Now(), Lifetime: l.claim.Worker.Lifetime, Client: l.claim.Client})
				}
			}
			if len(rs) > 0 {
				res, err := w.r.RenewLeases(w.ctx, pool, rs, time.Hour)
				if err != nil {
					w.fail("renew: %v", err)
				}
				w.step("renew %d leases of %s: re-created %v", len(rs), pool, res.Recreated)
			}
		case x < 84: // the record goes (stale expiry, the reaper); leases stay
			w.step("expire worker %s/%s", pool, id)
			if _, err := w.r.expireCheck(w.ctx, pool, id, 0, false); err != nil {
				w.fail("expire: %v", err)
			}
		case x < 89: // the agent registers again: its own generation
			if g := w.gens[pool+" "+id]; g != "" {
				w.register(pool, id, g)
			}
		case x < 93: // a new browser process, or an old one's agent coming back
			w.register(pool, id, fmt.Sprintf("g%d", 1+w.rng.IntN(3)))
		case x < 97:
			w.step("heartbeat %s/%s", pool, id)
			if _, err := w.r.Heartbeat(w.ctx, pool, id, time.Hour); err != nil && !errors.Is(err, ErrNotRegistered) {
				w.fail("heartbeat: %v", err)
			}
		default:
			w.step("reconcile %s", pool)
			if _, err := w.r.Reconcile(w.ctx, pool); err != nil {
				w.fail("reconcile: %v", err)
			}
		}
		w.check()
	}
}

// TestActiveCountFollowsLeases walks every path that adds or removes a
// lease or sets a count (claim, replayed and late claims, release, undo,
// cancel, expiry by claim, heartbeat and ExpireLeases, renewal of ended,
// expired and lost leases, a record's expiry, registration again with
// the same, a new or an earlier generation, reconcile), in two version
// groups sharing per-client counts, and checks after every step that each
// worker's active count is its generation's leases.
func TestActiveCountFollowsLeases(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	for seed := uint64(1); seed <= 4; seed++ {
		w := &countWalk{
			t: t, ctx: context.Background(), r: r, rdb: rdb, rng: rand.New(rand.NewPCG(seed, 12)),
			pools: []string{fmt.Sprintf("walk%d", seed), GroupPool(fmt.Sprintf("walk%d", seed), "1.50")},
			ids:   []string{"a", "b", "c"},
			caps:  map[string]int{"a": 1, "b": 2, "c": 3},
			gens:  map[string]string{},
		}
		w.step("seed %d", seed)
		w.run(800)
	}
}

// A registration counts its generation's live leases whatever record it
// replaces: an earlier generation registering again, or the same one over
// a record gone bad. Counted as zero, the worker would take sessions past
// its capacity (claims add to the stored count).
func TestRegistrationCountsItsGenerationsLeases(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if _, err := claimP(t, r, ""); err != nil {
		t.Fatal(err)
	}
	mustRegister(t, r, capReg("w", "gen-2", 2))
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if a, _, _ := figures(t, r, "w"); a != 1 {
		t.Fatalf("gen-1 registered again beside its live lease: active %d, want 1", a)
	}
	if _, err := claimP(t, r, ""); err != nil {
		t.Fatal(err)
	}
	if c, err := claimP(t, r, ""); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("a third session on capacity 2: %+v %v; want ErrNoWorker", c, err)
	}

	// The record goes bad (a counter that does not parse): the same
	// generation registering again replaces it, its two leases counted.
	if err := rdb.HSet(ctx, r.Key("p", keyDurations), "w", "not a number").Err(); err != nil {
		t.Fatal(err)
	}
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if a, l, _ := figures(t, r, "w"); a != 2 || l < 2 {
		t.Fatalf("the same generation over a bad record: active %d lifetime %d, want 2 and at least 2", a, l)
	}
	if c, err := claimP(t, r, ""); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("a third session on capacity 2 after the bad record: %+v %v; want ErrNoWorker", c, err)
	}
	if bad, err := activeDrift(ctx, r, rdb, "p"); err != nil || len(bad) > 0 {
		t.Fatalf("counts apart from the leases: %v %v", bad, err)
	}
}
