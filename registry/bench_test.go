package registry

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
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

// memoOff is the registry's library with the batch memo turned off
// (common.lua, MEMO: bind never sets it), under a name of its own.
var memoOff = func() *library {
	const name = "grid_memooff"
	l := &library{name: name, fns: map[string]function{}}
	on := "KEYS, ARGV, MEMO = keys, args, args.memo"
	if !strings.Contains(registryLib.source, on) {
		panic("registry: bind no longer reads " + on)
	}
	l.source = strings.Replace(strings.ReplaceAll(registryLib.source, registryLib.name, name), on,
		"KEYS, ARGV, MEMO = keys, args, nil", 1)
	for k, f := range registryLib.fns {
		f.lib = l
		for _, s := range []*string{&f.name, &f.roFn, &f.many} {
			*s = strings.Replace(*s, registryLib.name, name, 1)
		}
		l.fns[k] = f
	}
	return l
}()

// fcallUsec is the µs Redis spent inside FCALL so far (INFO commandstats).
func fcallUsec(b *testing.B, rdb redis.UniversalClient) float64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_fcall:"); ok {
			for _, kv := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(kv, "usec="); ok {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						b.Fatal(err)
					}
					return f
				}
			}
		}
	}
	return 0
}

// BenchmarkBatchMemo measures what the batch memo buys: each iteration
// sends a batch of 16 lifetime_first claims and then a batch of their 16
// releases through the library as built and through memoOff, one after
// the other, so that both meet the same machine. It reports Redis' µs
// inside FCALL per claim and release for each (memo-µs/pair,
// off-µs/pair) and their ratio. Capacity 1 puts each claim of a batch on
// another worker (only the config is read once); capacity 4 puts four
// claims on each worker, whose record is then decoded once.
func BenchmarkBatchMemo(b *testing.B) {
	r, rdb := startRegistry(b, Options{NoStaleExpiry: true})
	defer func() { scriptClaim, scriptLease = registryLib.function("claim"), registryLib.function("lease") }()
	const n, k = 2000, 16
	for _, capacity := range []int{1, 4} {
		pool := fmt.Sprintf("memo-cap%d", capacity)
		for i := range n {
			register(b, r, pool, fmt.Sprintf("w%05d", i), capacity)
		}
		b.Run(fmt.Sprintf("N=%d/cap=%d/batch=%d", n, capacity, k), func(b *testing.B) {
			req := ClaimRequest{Policy: LifetimeFirst, Holder: "bench", Limits: selection.Limits{MaxLifetime: 1 << 30}}
			libs := []*library{registryLib, memoOff}
			usec := make([]float64, len(libs))
			pairs := 0
			for b.Loop() {
				for i, l := range libs {
					scriptClaim, scriptLease = l.function("claim"), l.function("lease")
					before := fcallUsec(b, rdb)
					claims, errs := batchOf{pool: pool, n: k}.claims(b, r, req)
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
					for _, err := range (batchOf{pool: pool}).releases(b, r, claims) {
						if err != nil {
							b.Fatal(err)
						}
					}
					usec[i] += fcallUsec(b, rdb) - before
				}
				pairs += k
			}
			b.ReportMetric(usec[0]/float64(pairs), "memo-µs/pair")
			b.ReportMetric(usec[1]/float64(pairs), "off-µs/pair")
			b.ReportMetric(usec[0]/usec[1], "memo/off")
		})
	}
}
