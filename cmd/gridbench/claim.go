package main

// The claim section (issue 37): what one select-and-claim costs, for
// every policy, at N = 1,000 and 10,000 workers registered directly in a
// private redis-server (no agents, so no heartbeat either).
//
//   - Inside Redis: INFO commandstats' fcall usec delta over calls, taken
//     around a batch of claims, then around the batch of their ends
//     (EndServed, as an agent writes them), so that each delta holds one
//     kind of call; PING's time inside Redis is taken the same way in the
//     same rounds, which go round the policies in turn. Each figure is
//     the median of its rounds (the machine is shared: a round a
//     neighbour slowed does not move it), after a round not counted.
//   - As a client sees it: one claim, then one PING, alternating on one
//     connection; each claim's end is not timed.
//
//	gridbench -only claim          # about 15 s
//	gridbench -only claim -quick   # a few seconds, figures not meaningful

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

func init() {
	register(section{name: "claim", order: 20, run: runClaim})
}

// claimOptions are each policy's options as the handler's defaults make
// them (caddygrid/policy.go); a policy without a row takes none.
var claimOptions = map[registry.Policy]registry.PolicyOptions{
	registry.Vnode:     registry.VnodeOptions{Samples: selection.DefaultSamples, SlotJitter: selection.DefaultSlotJitter},
	registry.FairShare: registry.FairShareOptions{Window: selection.DefaultWindow, Default: selection.DefaultEstimate},
}

// claimRequest is a claim of group under policy as a handler with
// max_lifetime makes it, whose limits no claim of the section reaches: a
// worker takes 1,000 sessions at once (claims never find one full) and a
// max_lifetime no worker reaches keeps the lifetime checks in the path.
// The workers get no heartbeat here, so they stay fresh for an hour.
func claimRequest(group string, p registry.Policy) registry.ClaimRequest {
	return registry.ClaimRequest{
		Group: group, Policy: p, Options: claimOptions[p], Session: newID(), Instance: "gridbench",
		// stagger_drains is on by default for lifetime_first only
		Limits:     registry.Limits{MaxLifetime: 1_000_000, StaggerDrains: p == registry.LifetimeFirst},
		StaleAfter: time.Hour, MaxScan: selection.DefaultVnodeMaxScan,
	}
}

// claimRow is one pool size and policy's figures.
type claimRow struct {
	// claims and ends are the commands each round's batches ran inside
	// Redis.
	claims, ends []cmdStats
	client, ping []time.Duration
}

func runClaim(cfg *config) error {
	out := cfg.out
	sizes, batch, rounds, samples := []int{1_000, 10_000}, 200, 10, 2000
	if cfg.quick {
		sizes, batch, rounds, samples = []int{100, 1_000}, 50, 2, 200
	}
	w, err := newWorld()
	if err != nil {
		return err
	}
	defer w.close()
	ctx := context.Background()
	// One connection for every figure: a claim and the PING beside it
	// take the same way to Redis.
	one := redis.NewClient(&redis.Options{Addr: w.redis, PoolSize: 1})
	defer one.Close()
	reg := registry.New(one, registry.Options{})
	policies := registry.Policies()

	fmt.Fprintf(out, "Private redis-server, workers registered directly (capacity 1,000 each, weight 8, 8 ring positions), claims of a handler with\n")
	fmt.Fprintf(out, "max_lifetime 1,000,000 (never reached), stale_threshold 1h, max_scan %d; %d rounds of %d claims per policy, then their %d ends;\n",
		selection.DefaultVnodeMaxScan, rounds, batch, batch)
	fmt.Fprintf(out, "%d claims and PINGs alternating per policy for the client-visible p50.\n\n", samples)

	rows := map[int]map[registry.Policy]*claimRow{}
	pings := map[int][]cmdStats{}
	for _, n := range sizes {
		group := "bench" + strconv.Itoa(n)
		start := time.Now()
		if err := registerWorkers(ctx, w.reg, group, n); err != nil {
			return err
		}
		fmt.Fprintf(out, "(N=%s: registered in %s)\n", count(n), time.Since(start).Round(10*time.Millisecond))
		rows[n] = map[registry.Policy]*claimRow{}
		for _, p := range policies {
			rows[n][p] = &claimRow{}
			// a round not counted: the library loaded, the connection
			// made, Redis' memory and caches warm for this pool
			if _, _, err := claimBatch(ctx, reg, one, group, p, batch); err != nil {
				return fmt.Errorf("%s at N=%d: %w", p, n, err)
			}
		}
		// each round and sample goes round the policies from another one,
		// so that none is always measured first
		for round := range rounds {
			for k := range policies {
				p := policies[(round+k)%len(policies)]
				c, e, err := claimBatch(ctx, reg, one, group, p, batch)
				if err != nil {
					return fmt.Errorf("%s at N=%d: %w", p, n, err)
				}
				rows[n][p].claims = append(rows[n][p].claims, c)
				rows[n][p].ends = append(rows[n][p].ends, e)
			}
			ping, err := pingBatch(ctx, one, batch)
			if err != nil {
				return err
			}
			pings[n] = append(pings[n], cmdStats{"ping": ping})
		}
		for i := range samples {
			for k := range policies {
				p := policies[(i+k)%len(policies)]
				r := rows[n][p]
				t := time.Now()
				c, _, err := reg.Claim(ctx, claimRequest(group, p))
				if err != nil {
					return fmt.Errorf("%s at N=%d: %w", p, n, err)
				}
				r.client = append(r.client, time.Since(t))
				t = time.Now()
				if err := one.Ping(ctx).Err(); err != nil {
					return err
				}
				r.ping = append(r.ping, time.Since(t))
				if err := endClaim(ctx, reg, c); err != nil {
					return err
				}
			}
		}
	}

	fmt.Fprintln(out)
	fmt.Fprintln(out, "Inside Redis (commandstats, µs per call, the median of the rounds): fcall, and the commands its function ran (their time")
	fmt.Fprintln(out, "is inside fcall's; the rest is the function's own Lua, the calls between it and Redis included), beside PING's:")
	fmt.Fprintln(out)
	var trows, crows [][]string
	for _, n := range sizes {
		ping := median(pings[n], func(s cmdStats) float64 { return s["ping"].perCall() })
		for _, p := range policies {
			r := rows[n][p]
			claim, end := median(r.claims, fcallTime), median(r.ends, fcallTime)
			trows = append(trows, []string{count(n), string(p), f(claim, 1), f(median(r.claims, nestedCalls), 1), f(median(r.claims, nestedTime), 1),
				f(end, 1), f(median(r.ends, nestedCalls), 1), f(median(r.ends, nestedTime), 1), f(ping, 2), ratio(claim, ping)})
			cp, pp := quantile(r.client, 0.5), quantile(r.ping, 0.5)
			crows = append(crows, []string{count(n), string(p), us(cp), us(pp), ratio(float64(cp), float64(pp))})
		}
	}
	table(out, []string{"N", "policy", "claim (µs)", "its commands", "their µs", "end (µs)", "its commands", "their µs", "PING (µs)", "claim / PING"}, trows...)
	fmt.Fprintln(out, "As a client sees it (go-redis, one connection, a claim and a PING alternating):")
	fmt.Fprintln(out)
	table(out, []string{"N", "policy", "claim p50 (µs)", "PING p50 (µs)", "claim / PING"}, crows...)

	top := sizes[len(sizes)-1]
	lf := rows[top][registry.LifetimeFirst]
	inRedis := median(lf.claims, fcallTime)
	ping := median(pings[top], func(s cmdStats) float64 { return s["ping"].perCall() })
	cp, pp := quantile(lf.client, 0.5), quantile(lf.ping, 0.5)
	goals(out,
		goal{"lifetime_first claim inside Redis, N=" + count(top), f(inRedis, 1) + " µs", "PING " + f(ping, 2) + " µs inside Redis",
			ratio(inRedis, ping), "≤ 30 µs", inRedis <= 30},
		goal{"lifetime_first claim p50 as a client sees it, N=" + count(top), us(cp) + " µs", "PING p50 " + us(pp) + " µs, interleaved",
			ratio(float64(cp), float64(pp)), "≤ 2× PING p50", float64(cp) <= 2*float64(pp)},
	)
	if cfg.quick {
		fmt.Fprintf(out, "(-quick: the targets are read at N=%s instead of 10,000.)\n", count(top))
	}
	return nil
}

// registerWorkers registers n workers in group from 8 connections at once.
func registerWorkers(ctx context.Context, reg *registry.Registry, group string, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n && errs[g] == nil; i += 8 {
				rec := registry.NewRecord(registry.Record{ID: fmt.Sprintf("w%05d", i), Pool: group, Browser: "chromium",
					Addr: "127.0.0.1:" + strconv.Itoa(10000+i), Path: "/playwright", Capacity: 1000, Weight: 8}, 0, nil)
				errs[g] = reg.Register(ctx, rec, registry.AgentState{}, "")
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("registering %d workers: %w", n, err)
		}
	}
	return nil
}

// claimBatch makes n claims, then ends them, and returns the commands
// Redis ran for each half.
func claimBatch(ctx context.Context, reg *registry.Registry, rdb *redis.Client, group string, p registry.Policy, n int) (claims, ends cmdStats, err error) {
	s0, err := readCommandStats(ctx, rdb)
	if err != nil {
		return nil, nil, err
	}
	cs := make([]registry.Claim, 0, n)
	for range n {
		c, _, err := reg.Claim(ctx, claimRequest(group, p))
		if err != nil {
			return nil, nil, err
		}
		cs = append(cs, c)
	}
	s1, err := readCommandStats(ctx, rdb)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range cs {
		if err := endClaim(ctx, reg, c); err != nil {
			return nil, nil, err
		}
	}
	s2, err := readCommandStats(ctx, rdb)
	if err != nil {
		return nil, nil, err
	}
	claims, ends = s1.minus(s0), s2.minus(s1)
	// the INFO that read s1 counts in the second delta
	delete(claims, "info")
	delete(ends, "info")
	return claims, ends, nil
}

// pingBatch sends n PINGs and returns their figures inside Redis.
func pingBatch(ctx context.Context, rdb *redis.Client, n int) (cmdStat, error) {
	s0, err := readCommandStats(ctx, rdb)
	if err != nil {
		return cmdStat{}, err
	}
	for range n {
		if err := rdb.Ping(ctx).Err(); err != nil {
			return cmdStat{}, err
		}
	}
	s1, err := readCommandStats(ctx, rdb)
	if err != nil {
		return cmdStat{}, err
	}
	return s1.minus(s0)["ping"], nil
}

// endClaim ends a claim as its agent ends a served session.
func endClaim(ctx context.Context, reg *registry.Registry, c registry.Claim) error {
	n, err := reg.EndServed(ctx, c.Group, c.Worker.ID, []registry.Ended{{Session: c.Session, Duration: 10 * time.Second}})
	if err == nil && n != 1 {
		err = fmt.Errorf("ending session %s of worker %s ended %d sessions", c.Session, c.Worker.ID, n)
	}
	return err
}

// median is the median over rounds of a figure of each.
func median(rounds []cmdStats, figure func(cmdStats) float64) float64 {
	xs := make([]float64, len(rounds))
	for i, s := range rounds {
		xs[i] = figure(s)
	}
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// The figures of a round: fcall's µs per call, and per fcall the
// commands its function ran and their µs.
func fcallTime(s cmdStats) float64   { return s["fcall"].perCall() }
func nestedCalls(s cmdStats) float64 { return s.nested().calls / s["fcall"].calls }
func nestedTime(s cmdStats) float64  { return s.nested().usec / s["fcall"].calls }
