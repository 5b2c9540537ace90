package registry

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// BenchmarkClaim times one claim and its release on a pool of N workers,
// for every policy, on a private redis-server. The per-op time should stay
// flat from N=100 to N=10,000 (cmd/gridbench's registry section compares it
// with an O(N) scan). One worker is draining, so the "+stagger"
// runs (StaggerDrains) read a retiring set of one member, as a pool
// mid-restart has.
func BenchmarkClaim(b *testing.B) {
	r, _ := startRegistry(b, Options{NoStaleExpiry: true})
	ctx := context.Background()
	limits := selection.Limits{MaxConcurrent: 5, MaxLifetime: 1_000_000, StaleAfter: time.Minute, MaxScan: 16}
	for _, n := range []int{100, 1_000, 10_000} {
		pool := fmt.Sprintf("n%d", n)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < n; i += 8 {
					if err := r.Register(ctx, Registration{Pool: pool, ID: fmt.Sprintf("w%05d", i), Addr: "h:1", TTL: time.Hour}); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := r.SetDraining(ctx, pool, "w00000"); err != nil {
			b.Fatal(err)
		}
		for _, run := range []struct {
			p       Policy
			stagger bool
		}{{LifetimeFirst, false}, {LifetimeFirst, true}, {Vnode, false}, {Vnode, true}, {FairShare, false}, {FairShare, true}} {
			name := fmt.Sprintf("N=%d/%s", n, run.p)
			if run.stagger {
				name += "+stagger"
			}
			b.Run(name, func(b *testing.B) {
				l := limits
				l.StaggerDrains = run.stagger
				req := ClaimRequest{Pool: pool, Policy: run.p, Limits: l}
				// The first claim with new limits reindexes the pool: not timed.
				if c, err := r.Claim(ctx, req); err != nil || r.Release(ctx, pool, c.LeaseID) != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					c, err := r.Claim(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					if err := r.Release(ctx, pool, c.LeaseID); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
