package main

// The bounds section (issue 9): what a change of limits costs a claim, and
// how long Redis stays blocked while a reaper passes over a big pool.
//
//   - Claim cost at 5,000 workers while two claimers alternate: agreeing on
//     max_concurrent 3; disagreeing (2 and 3) with configurations of
//     different times (the older one runs under the newer one's limits);
//     and disagreeing with no configuration time (each claim's limits win
//     in turn, so every claim changes the pool's limits). Target: the
//     disagreeing cost at most 2× the agreeing one.
//   - Redis PING latency (p50, p99, max) from a second connection while one
//     reaper pass (Inspect, stale expiry, Reconcile) runs over 10,000
//     workers holding 10,000 leases. Target: p99 ≤ 5 ms.
//
//	gridbench -only bounds    # about 30 s

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/browsergrid/caddy-browser-grid/reaper"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

func init() {
	register(section{name: "registry-bounds", order: 21, run: runBounds})
}

func runBounds(cfg *config) error {
	w := cfg.out
	reg, rdb, stop, err := regOpen()
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()

	budget := 2 * time.Second
	nClaim, nReap := 5_000, 10_000
	if cfg.quick {
		budget, nClaim, nReap = 100*time.Millisecond, 500, 1_000
	}
	const pool = "limits"
	if err := regPopulate(ctx, reg, rdb, pool, nClaim); err != nil {
		return err
	}
	older := time.Now().Add(-time.Hour)
	limits := func(mc int) selection.Limits {
		return selection.Limits{MaxConcurrent: mc, MaxLifetime: 1_000_000, StaleAfter: time.Minute, MaxScan: 16}
	}
	type claimer struct {
		mc int
		at time.Time
	}
	cases := []struct {
		name string
		a, b claimer
	}{
		{"agreeing (max_concurrent 3 and 3)", claimer{3, older}, claimer{3, older}},
		{"disagreeing, configured at different times (2, then 3 an hour later)", claimer{2, older}, claimer{3, older.Add(time.Hour)}},
		{"disagreeing, no configuration time: every claim changes the limits (2 and 3)", claimer{2, time.Time{}}, claimer{3, time.Time{}}},
	}
	costs := make([]time.Duration, len(cases))
	for i, c := range cases {
		turn := 0
		var lease string
		d, _, err := regMeasure(budget, func() error {
			return reg.Release(ctx, pool, lease)
		}, func() error {
			cl := c.a
			if turn++; turn%2 == 0 {
				cl = c.b
			}
			got, err := reg.Claim(ctx, registry.ClaimRequest{Pool: pool, Policy: registry.LifetimeFirst, Limits: limits(cl.mc),
				ConfigTime: cl.at, Holder: "gridbench"})
			if err == nil {
				lease = got.LeaseID
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("claims %s: %w", c.name, err)
		}
		costs[i] = d
	}
	fmt.Fprintf(w, "Claim cost at %d workers, two claimers alternating (lifetime_first, median µs per claim):\n\n", nClaim)
	fmt.Fprintln(w, "| claimers | µs | × agreeing |")
	fmt.Fprintln(w, "|---|---:|---:|")
	worst := 0.0
	for i, c := range cases {
		ratio := float64(costs[i]) / float64(costs[0])
		if i > 0 {
			worst = max(worst, ratio)
		}
		fmt.Fprintf(w, "| %s | %s | %.2f× |\n", c.name, regUS(costs[i]), ratio)
	}
	fmt.Fprintf(w, "\nTarget: disagreeing ≤ 2× agreeing: %.2f× (%s).\n\n", worst, regVerdict(worst <= 2))

	// The reaper pass over a big pool.
	const big = "reap"
	if err := regPopulate(ctx, reg, rdb, big, nReap); err != nil {
		return err
	}
	req := registry.ClaimRequest{Pool: big, Policy: registry.Vnode, LeaseTTL: time.Hour, Holder: "gridbench",
		Limits: selection.Limits{MaxConcurrent: 3, StaleAfter: time.Hour}}
	for range nReap {
		if _, err := reg.Claim(ctx, req); err != nil {
			return fmt.Errorf("claiming the leases for the reaper pass: %w", err)
		}
	}
	// A few wrong counts and orphans for the pass to fix.
	for i := range 20 {
		if err := rdb.HSet(ctx, reg.Key(big, "active"), fmt.Sprintf("w%05d", i*37), 9, fmt.Sprintf("ghost%d", i), 1).Err(); err != nil {
			return err
		}
	}
	ping := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, PoolSize: 1})
	defer ping.Close()
	if err := ping.Ping(ctx).Err(); err != nil {
		return err
	}
	if err := rdb.ConfigSet(ctx, "slowlog-log-slower-than", "2000").Err(); err != nil {
		return err
	}
	if err := rdb.SlowLogReset(ctx).Err(); err != nil {
		return err
	}
	// PING alone first, as long as the pass takes at most, for comparison.
	var idle []time.Duration
	for start := time.Now(); time.Since(start) < budget; {
		t := time.Now()
		if err := ping.Ping(ctx).Err(); err != nil {
			return err
		}
		idle = append(idle, time.Since(t))
	}
	slices.Sort(idle)
	var pings []time.Duration
	done := make(chan struct{})
	var rep reaper.Report
	var passErr error
	var pass time.Duration
	go func() {
		defer close(done)
		rp := &reaper.Reaper{Registry: reg, StaleAfter: time.Hour}
		start := time.Now()
		rep, passErr = rp.RunOnce(ctx)
		pass = time.Since(start)
	}()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			t := time.Now()
			if err := ping.Ping(ctx).Err(); err != nil {
				return err
			}
			pings = append(pings, time.Since(t))
		}
	}
	if passErr != nil {
		return fmt.Errorf("reaper pass: %w", passErr)
	}
	slices.Sort(pings)
	quant := func(ds []time.Duration, p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	q := func(p float64) time.Duration { return quant(pings, p) }
	fmt.Fprintf(w, "Redis PING from a second connection during one reaper pass over %d workers and %d leases (%s, %d pools, %d counters fixed, %d orphans removed):\n\n",
		nReap, nReap, pass.Round(time.Millisecond), len(rep.Pools), rep.CountersFixed, rep.OrphansRemoved)
	fmt.Fprintln(w, "| PING | pings | p50 µs | p99 µs | max µs |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	fmt.Fprintf(w, "| alone (before the pass) | %d | %s | %s | %s |\n", len(idle), regUS(quant(idle, 0.5)), regUS(quant(idle, 0.99)), regUS(idle[len(idle)-1]))
	fmt.Fprintf(w, "| during the reaper pass | %d | %s | %s | %s |\n", len(pings), regUS(q(0.5)), regUS(q(0.99)), regUS(pings[len(pings)-1]))
	fmt.Fprintf(w, "\nTarget: p99 ≤ 5 ms: %s (%s).\n", q(0.99).Round(10*time.Microsecond), regVerdict(q(0.99) <= 5*time.Millisecond))
	logs, err := rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		return err
	}
	slices.SortFunc(logs, func(a, b redis.SlowLog) int { return int(b.Duration - a.Duration) })
	fmt.Fprintf(w, "Redis calls above 2 ms during the pass (SLOWLOG): %d", len(logs))
	for i, l := range logs[:min(5, len(logs))] {
		if i == 0 {
			fmt.Fprint(w, "; longest:")
		}
		fmt.Fprintf(w, " %s %s", l.Duration.Round(10*time.Microsecond), boundsWhat(l.Args))
	}
	fmt.Fprintln(w)
	return nil
}

// boundsWhat names a SLOWLOG entry: a registry script's stage (its 19th
// argument, after the 15 keys and now, channel, pool) or the command.
func boundsWhat(args []string) string {
	if len(args) > 22 && (args[0] == "evalsha" || args[0] == "eval" || args[0] == "fcall") {
		if args[21] == "scan" {
			return "reconcile scan " + args[22]
		}
		return "script " + args[21]
	}
	if len(args) > 0 {
		return args[0]
	}
	return "?"
}
