package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// Every operation works on a real three-node Redis Cluster: all keys of a
// pool share one hash slot and every script names its keys, so no command
// is refused with CROSSSLOT. Pools land on different nodes.
func TestRedisCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := testenv.StartCluster(t)
	rdb, err := NewClient(cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewClient(%s) gave %T, want a cluster client", cl.URL(), rdb)
	}
	r := New(rdb, Options{})
	// A version group is a pool for every operation, in its pool's slot.
	pools := []string{"chromium", "firefox", "webkit", "p1", "p2", "chromium@1.65"}
	nodes := map[string]bool{}
	for _, pool := range pools {
		// Every key of the pool (and of its version groups) hashes to one slot.
		slot := int64(-1)
		keys := append(r.poolKeys(pool), r.Key(pool, keyReaperLock), r.Key(pool, keyVersions))
		if base, _ := SplitGroup(pool); base != pool {
			keys = append(keys, r.poolKeys(base)...)
		} else {
			keys = append(keys, r.poolKeys(GroupPool(pool, "1.64"))...)
		}
		for _, k := range keys {
			s, err := cc.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && s != slot {
				t.Fatalf("key %s is in slot %d, not %d like the rest of pool %s", k, s, slot, pool)
			}
			slot = s
		}
		slots, err := cc.ClusterSlots(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) {
				nodes[s.Nodes[0].Addr] = true
			}
		}
	}
	if len(nodes) < 2 {
		t.Fatalf("the test pools all live on %v: the test would not cross nodes", nodes)
	}

	wake, err := r.Wakeups(ctx, pools...)
	if err != nil {
		t.Fatal(err)
	}
	for _, pool := range pools {
		t.Run(pool, func(t *testing.T) {
			must := func(what string, err error) {
				t.Helper()
				if err != nil {
					if strings.Contains(err.Error(), "CROSSSLOT") {
						t.Fatalf("%s: CROSSSLOT: %v", what, err)
					}
					t.Fatalf("%s: %v", what, err)
				}
			}
			for _, id := range []string{"a", "b", "c"} {
				must("register", r.Register(ctx, Registration{Pool: pool, ID: id, Addr: "h:1", Path: "/", TTL: time.Minute}))
			}
			_, err := r.Heartbeat(ctx, pool, "a", time.Minute)
			must("heartbeat", err)
			var leases []string
			var renewals []LeaseRenewal
			for _, p := range []Policy{LifetimeFirst, Vnode, FairShare} {
				req := ClaimRequest{Pool: pool, Policy: p, Limits: selection.Limits{MaxConcurrent: 2, MaxLifetime: 10, StaleAfter: 30 * time.Second}}
				_, _, err := r.Pick(ctx, req)
				must("pick "+string(p), err)
				c, err := r.Claim(ctx, req)
				must("claim "+string(p), err)
				leases = append(leases, c.LeaseID)
				renewals = append(renewals, renewal(c))
			}
			// "x" is missing: re-created (and ended by the release below).
			renewals = append(renewals, LeaseRenewal{ID: "x", Worker: "a", Gen: renewals[0].Gen, Claimed: time.Now(), Lifetime: 1})
			res, err := r.RenewLeases(ctx, pool, renewals, time.Minute)
			must("renew", err)
			if len(res.Recreated) != 1 || len(res.Ended) != 0 {
				t.Fatalf("renew: %+v", res)
			}
			must("cancel", r.Cancel(ctx, pool, "x"))
			must("release", r.Release(ctx, pool, leases[0]))
			must("undo", r.Undo(ctx, pool, leases[1], time.Second))
			_, err = r.ExpireLeases(ctx, pool, 10)
			must("expire leases", err)
			must("drain", r.Drain(ctx, pool, "b"))
			must("set draining", r.SetDraining(ctx, pool, "b"))
			_, err = r.Worker(ctx, pool, "b")
			must("worker", err)
			info, err := r.Inspect(ctx, pool)
			must("inspect", err)
			if len(info.Workers) != 3 || info.Leases != 1 {
				t.Fatalf("inspect: %d workers, %d leases", len(info.Workers), info.Leases)
			}
			_, err = r.Reconcile(ctx, pool)
			must("reconcile", err)
			_, err = r.ForgetLimits(ctx, pool, time.UnixMilli(1))
			must("forget limits", err)
			unlock, ok, err := r.ReaperLock(ctx, pool, time.Minute)
			must("reaper lock", err)
			if !ok {
				t.Fatal("reaper lock not taken")
			}
			must("unlock", unlock(ctx))
			_, err = r.Expire(ctx, pool, "c", 30*time.Second)
			must("expire", err)
			must("deregister", r.Deregister(ctx, pool, "a"))
			if _, err := r.Worker(ctx, pool, "a"); !errors.Is(err, ErrNotRegistered) {
				t.Fatalf("worker after deregister: %v", err)
			}
		})
	}
	got, err := r.Pools(ctx)
	if err != nil || len(got) != len(pools) {
		t.Fatalf("Pools: %v %v", got, err)
	}
	seen := map[string]bool{}
	for len(seen) < len(pools) {
		select {
		case p := <-wake:
			seen[p] = true
		case <-ctx.Done():
			t.Fatalf("wakeups seen from %v only", seen)
		}
	}
}
