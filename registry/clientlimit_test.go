package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func redisZ(score int64, member string) redis.Z {
	return redis.Z{Score: float64(score), Member: member}
}

// The per-client limit (issue 10, item 4): a client's live sessions follow
// its leases, whatever ends them.

func clientClaim(t *testing.T, r *Registry, key string, limit int, now time.Time) (*Claim, error) {
	t.Helper()
	return r.Claim(context.Background(), ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: capLimits,
		LeaseTTL: time.Second, ClientKey: key, ClientLimit: limit, Now: now})
}

func clientSessions(t *testing.T, r *Registry, key string) int {
	t.Helper()
	n, err := r.ClientSessions(context.Background(), "p", key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestClientLimit(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 10))
	now := time.Now()

	for i := range 2 {
		if _, err := clientClaim(t, r, "10.0.0.1", 2, now); err != nil {
			t.Fatalf("claim %d of client A: %v", i+1, err)
		}
	}
	_, err := clientClaim(t, r, "10.0.0.1", 2, now)
	var le *ClientLimitError
	if !errors.As(err, &le) || !errors.Is(err, ErrClientLimit) || le.Live != 2 || le.Limit != 2 {
		t.Fatalf("third claim of client A: %v; want a ClientLimitError 2 of 2", err)
	}
	if a, l, _ := figures(t, r, "w"); a != 2 || l != 2 {
		t.Fatalf("the refused claim counted: active %d lifetime %d; want 2 and 2", a, l)
	}
	if _, err := clientClaim(t, r, "10.0.0.2", 2, now); err != nil {
		t.Fatalf("client B while A is at its limit: %v", err)
	}
	// A claim without a limit is not refused, and with a key it counts.
	if _, err := clientClaim(t, r, "10.0.0.1", 0, now); err != nil {
		t.Fatalf("client A without a limit: %v", err)
	}
	if n := clientSessions(t, r, "10.0.0.1"); n != 3 {
		t.Fatalf("client A holds %d sessions; want 3", n)
	}
	// Redis holds hashes only.
	for _, k := range []string{keyLeaseClient, keyLeases} {
		dump, _ := rdb.Dump(ctx, r.Key("p", k)).Result()
		if strings.Contains(dump, "10.0.0.") {
			t.Fatalf("%s holds a raw client key", k)
		}
	}
}

// Every way a lease ends gives the client's session back, once.
func TestClientCountFollowsTheLease(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		end  func(t *testing.T, r *Registry, c *Claim, now time.Time)
	}{
		{"release", func(t *testing.T, r *Registry, c *Claim, _ time.Time) {
			if err := r.Release(ctx, "p", c.LeaseID); err != nil {
				t.Fatal(err)
			}
		}},
		{"undo", func(t *testing.T, r *Registry, c *Claim, _ time.Time) {
			if err := r.Undo(ctx, "p", c.LeaseID, time.Second); err != nil {
				t.Fatal(err)
			}
		}},
		{"cancel", func(t *testing.T, r *Registry, c *Claim, _ time.Time) {
			if err := r.Cancel(ctx, "p", c.LeaseID); err != nil {
				t.Fatal(err)
			}
		}},
		{"expiry by the reaper", func(t *testing.T, r *Registry, c *Claim, now time.Time) {
			// The holder crashed: nobody renews; once the TTL has passed
			// the reaper's ExpireLeases frees it.
			if n, err := r.run(ctx, scriptLease, "p", toMS(now.Add(2*time.Second)), "expire", r.opts.DurationWindow, 100).Int(); err != nil || n != 1 {
				t.Fatalf("expiring: %d %v", n, err)
			}
		}},
		{"expiry by a claim", func(t *testing.T, r *Registry, c *Claim, now time.Time) {
			// The next claim frees lapsed leases before it counts: the
			// client is served again at its limit of 1.
			if _, err := clientClaim(t, r, "client", 1, now.Add(2*time.Second)); err != nil {
				t.Fatalf("claim after the lease lapsed: %v", err)
			}
		}},
		{"reconcile", func(t *testing.T, r *Registry, c *Claim, now time.Time) {
			if _, err := r.Reconcile(ctx, "p"); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, rdb := startRegistry(t, Options{})
			mustRegister(t, r, capReg("w", "gen-1", 10))
			now := time.Now()
			c, err := clientClaim(t, r, "client", 1, now)
			if err != nil {
				t.Fatal(err)
			}
			if n := clientSessions(t, r, "client"); n != 1 {
				t.Fatalf("after the claim: %d sessions; want 1", n)
			}
			if _, err := clientClaim(t, r, "client", 1, now); !errors.Is(err, ErrClientLimit) {
				t.Fatalf("second claim at a limit of 1: %v; want ErrClientLimit", err)
			}
			if tc.name == "reconcile" {
				// the lease lapsed and the reaper's pass runs
				if err := rdb.ZAdd(ctx, r.Key("p", keyLeaseExpiry), redisZ(toMS(now)-1, c.LeaseID)).Err(); err != nil {
					t.Fatal(err)
				}
			}
			tc.end(t, r, c, now)
			want := 0
			if tc.name == "expiry by a claim" {
				want = 1 // the new claim's
			}
			if n := clientSessions(t, r, "client"); n != want {
				t.Fatalf("after %s: %d sessions; want %d", tc.name, n, want)
			}
			// Ending it again (a retry) frees nothing twice.
			if err := r.Release(ctx, "p", c.LeaseID); err != nil {
				t.Fatal(err)
			}
			if n := clientSessions(t, r, "client"); n != want {
				t.Fatalf("after a second release: %d sessions; want %d", n, want)
			}
		})
	}
}

// Redis lost everything: the holder's renewal re-creates the lease and
// the client's count with it; reconcile repairs a lost or stray entry.
func TestClientCountSurvivesRenewalAndReconcile(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 10))
	c, err := clientClaim(t, r, "client", 2, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Client != ClientHash("client") || len(c.Client) != 32 {
		t.Fatalf("claim's client hash %q", c.Client)
	}
	// The lease and its entry are lost (an empty restart of Redis).
	rdb.Del(ctx, r.Key("p", keyLeases), r.Key("p", keyLeaseClient), r.Key("p", keyLeaseExpiry), r.Key("p", keyLeaseOwner))
	if n := clientSessions(t, r, "client"); n != 0 {
		t.Fatalf("after the loss: %d", n)
	}
	ren := renewal(c)
	ren.Client = c.Client
	res, err := r.RenewLeases(ctx, "p", []LeaseRenewal{ren}, time.Minute)
	if err != nil || len(res.Recreated) != 1 {
		t.Fatalf("renewal: %+v %v", res, err)
	}
	if n := clientSessions(t, r, "client"); n != 1 {
		t.Fatalf("after the renewal re-created the lease: %d sessions; want 1", n)
	}
	// A lost entry is put back, a stray one removed.
	rdb.Del(ctx, r.Key("p", keyLeaseClient))
	rdb.ZAdd(ctx, r.Key("p", keyLeaseClient), redisZ(0, c.Client+" stray-lease"))
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if n := clientSessions(t, r, "client"); n != 1 {
		t.Fatalf("after reconcile: %d sessions; want 1", n)
	}
	// A renewal with a client hash that is not one is ended, not sent.
	bad := renewal(c)
	bad.Client = "not hex"
	if res, err := r.RenewLeases(ctx, "p", []LeaseRenewal{bad}, time.Minute); err != nil || len(res.Ended) != 1 {
		t.Fatalf("renewal with a bad client hash: %+v %v", res, err)
	}
}

// A client's limit holds across the pool's Playwright version groups (their
// keys share the pool's slot), and reconciling one group keeps the entries
// of another group's leases.
func TestClientLimitAcrossVersionGroups(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	p64, p65 := GroupPool("p", "1.64"), GroupPool("p", "1.65")
	register(t, r, p64, "a1", 4)
	register(t, r, p65, "b1", 4)
	claim := func(pool string) error {
		_, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, ClientKey: "10.0.0.9", ClientLimit: 2})
		return err
	}
	if err := claim(p64); err != nil {
		t.Fatalf("first session (1.64): %v", err)
	}
	if err := claim(p65); err != nil {
		t.Fatalf("second session (1.65): %v", err)
	}
	if err := claim(p64); !errors.Is(err, ErrClientLimit) {
		t.Fatalf("third session (1.64): %v; want ErrClientLimit (2 live in the pool's groups)", err)
	}
	for _, g := range []string{p64, p65, "p"} {
		if _, err := r.Reconcile(ctx, g); err != nil {
			t.Fatalf("reconciling %s: %v", g, err)
		}
	}
	if n := clientSessions(t, r, "10.0.0.9"); n != 2 {
		t.Fatalf("after reconciling every group the client holds %d sessions; want 2", n)
	}
	if err := claim(p65); !errors.Is(err, ErrClientLimit) {
		t.Fatalf("third session after reconcile: %v; want ErrClientLimit", err)
	}
}
