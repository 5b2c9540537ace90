package main

// The recycle section (issue 40): how a pool's capacity holds while its
// workers restart at max_lifetime. Two bin/caddy instances share one
// Redis and two bin/grid-worker agents (fake launcher, -respawn, every
// other agent default); the handler has max_concurrent 2, max_lifetime 3
// and every other option at its default. Three clients, taking the two
// instances in turn, open 200 ms sessions back to back until ten worker
// restarts have happened (a restart: a browser registered after the
// start). Every 10 ms a sampler reads the pool from Redis and counts its
// free slots (freeSlots says what counts). The run is made twice, fresh
// each time: with stagger_drains on (lifetime_first's default) and off;
// each is the other's baseline.
//
//	gridbench -only recycle          # about 10 s
//	gridbench -only recycle -quick   # a smoke run

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

func init() {
	register(section{name: "recycle", order: 60, run: runRecycle})
}

// The handler's limits in both runs.
const (
	recycleMaxConcurrent = 2
	recycleMaxLifetime   = 3
	// recycleStale is the grid app's default stale_threshold.
	recycleStale = 30 * time.Second
)

// recycled is one run's figures.
type recycled struct {
	restarts, sessions int
	// minFree is the fewest free slots a sample saw; zeroLongest the
	// longest time between a sample that saw none and the next that saw
	// some, zeroTotal all such times.
	minFree                int
	zeroLongest, zeroTotal time.Duration
	samples                int
	waits                  []time.Duration
	// unavailable counts 503s; failed the other failures, firstFailure
	// the first of them.
	unavailable, failed int
	firstFailure        string
	took                time.Duration
	// stopped: the deadline passed before the restarts happened.
	stopped bool
}

func runRecycle(cfg *config) error {
	out := cfg.out
	restarts, deadline := 10, 3*time.Minute
	if cfg.quick {
		restarts, deadline = 3, 40*time.Second
	}
	runs := []struct {
		name    string
		stagger bool
	}{{"stagger_drains on (default)", true}, {"stagger_drains off", false}}
	res := make([]recycled, len(runs))
	for i, r := range runs {
		var err error
		if res[i], err = recycleRun(r.stagger, restarts, deadline); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
	}

	fmt.Fprintf(out, "Two bin/caddy, two agents (fake launcher, -respawn, defaults), handler max_concurrent %d, max_lifetime %d (defaults otherwise);\n",
		recycleMaxConcurrent, recycleMaxLifetime)
	fmt.Fprintf(out, "3 clients opening 200 ms sessions back to back until %d worker restarts; the pool's free slots sampled from Redis every 10 ms.\n", restarts)
	fmt.Fprintln(out, "A free slot is one a claim of this handler could take now: of a worker available, fresh and not suspect, the slots below")
	fmt.Fprintln(out, "its cap and within the sessions left of its lifetime, less its last one while that is held back (hold, or another worker")
	fmt.Fprintln(out, "retiring under stagger_drains); a worker at its lifetime has none, however few sessions it holds.")
	fmt.Fprintln(out)
	row := func(what string, v func(r recycled) string) []string {
		cells := []string{what}
		for _, r := range res {
			cells = append(cells, v(r))
		}
		return cells
	}
	ms := func(d time.Duration) string { return f(float64(d.Microseconds())/1e3, 1) }
	head := []string{"figure"}
	for _, r := range runs {
		head = append(head, r.name)
	}
	table(out, head,
		row("worker restarts", func(r recycled) string {
			if r.stopped {
				return strconv.Itoa(r.restarts) + " (deadline reached)"
			}
			return strconv.Itoa(r.restarts)
		}),
		row("sessions served", func(r recycled) string { return strconv.Itoa(r.sessions) }),
		row("run time (s)", func(r recycled) string { return f(r.took.Seconds(), 1) }),
		row("pool samples", func(r recycled) string { return strconv.Itoa(r.samples) }),
		row("minimum free slots", func(r recycled) string { return strconv.Itoa(r.minFree) }),
		row("longest time with zero free slots (ms)", func(r recycled) string { return ms(r.zeroLongest) }),
		row("time with zero free slots, in all (ms)", func(r recycled) string { return ms(r.zeroTotal) }),
		row("wait p50 (ms)", func(r recycled) string { return ms(quantile(r.waits, 0.5)) }),
		row("wait p99 (ms)", func(r recycled) string { return ms(quantile(r.waits, 0.99)) }),
		row("wait max (ms)", func(r recycled) string { return ms(quantile(r.waits, 1)) }),
		row("503s", func(r recycled) string { return strconv.Itoa(r.unavailable) }),
		row("other failures", func(r recycled) string { return strconv.Itoa(r.failed) }),
	)
	for i, r := range res {
		if r.firstFailure != "" {
			fmt.Fprintf(out, "(%s, first failure: %s)\n", runs[i].name, r.firstFailure)
		}
	}
	var gs []goal
	for i, r := range res {
		gs = append(gs, goal{"503s, " + runs[i].name, strconv.Itoa(r.unavailable), fmt.Sprintf("%d sessions served", r.sessions), "—",
			"0: a pool keeps its capacity through restarts with -respawn (docs/design.md)", r.unavailable == 0})
	}
	goals(out, gs...)
	return nil
}

// recycleRun makes one run in a world of its own.
func recycleRun(stagger bool, restarts int, deadline time.Duration) (recycled, error) {
	var res recycled
	w, err := newWorld()
	if err != nil {
		return res, err
	}
	defer w.close()
	if err := w.startAgents(2, benchPool, "--respawn"); err != nil {
		return res, err
	}
	block := fmt.Sprintf("\t\tmax_concurrent %d\n\t\tmax_lifetime %d\n", recycleMaxConcurrent, recycleMaxLifetime)
	if !stagger {
		block += "\t\tstagger_drains off\n"
	}
	routes, err := w.gridInstances(2, block)
	if err != nil {
		return res, err
	}
	first, err := w.available(benchPool)
	if err != nil {
		return res, err
	}
	seen := map[string]bool{}
	for _, wk := range first {
		seen[wk.ID] = true
	}

	stop := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for c := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := routes[(c+i)%len(routes)]
				t := time.Now()
				conn, resp, err := r.dial()
				wait := time.Since(t)
				mu.Lock()
				switch {
				case err == nil:
					res.waits = append(res.waits, wait)
					res.sessions++
				case resp != nil && resp.StatusCode == 503:
					res.unavailable++
				default:
					res.failed++
					if res.firstFailure == "" {
						res.firstFailure = err.Error()
					}
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond) // no spin on a failure that comes at once
					continue
				}
				time.Sleep(200 * time.Millisecond)
				_ = conn.Close(1000, "")
			}
		}()
	}

	ctx := context.Background()
	res.minFree = -1
	var zeroSince time.Time
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		groups, _, err := w.reg.InspectPool(ctx, benchPool)
		if err != nil {
			close(stop)
			wg.Wait()
			return res, err
		}
		now := time.Now()
		free := 0
		for _, g := range groups {
			free += freeSlots(g, stagger)
			for _, wk := range g.Workers {
				seen[wk.ID] = true
			}
		}
		res.samples++
		if res.minFree < 0 || free < res.minFree {
			res.minFree = free
		}
		switch {
		case free == 0 && zeroSince.IsZero():
			zeroSince = now
		case free > 0 && !zeroSince.IsZero():
			res.zeroTotal += now.Sub(zeroSince)
			res.zeroLongest = max(res.zeroLongest, now.Sub(zeroSince))
			zeroSince = time.Time{}
		}
		res.restarts = len(seen) - len(first)
		if res.restarts >= restarts || now.Sub(start) > deadline {
			if !zeroSince.IsZero() {
				res.zeroTotal += now.Sub(zeroSince)
				res.zeroLongest = max(res.zeroLongest, now.Sub(zeroSince))
			}
			break
		}
	}
	close(stop)
	wg.Wait()
	res.took = time.Since(start)
	res.stopped = res.restarts < restarts
	return res, nil
}

// freeSlots counts the sessions a claim of the section's handler could
// take in group now, as Redis holds it (claim.lua's rules): for each
// worker available, fresh and not suspect, the slots below its cap (its
// capacity and max_concurrent, the smaller) and within the sessions left
// of its lifetime, less the last of those while it is held back (its
// agent still drains the browser it replaced, or under stagger_drains
// another worker of the group retires). A worker at its max_lifetime is
// retiring, draining or replaced: however few sessions it holds, it takes
// no more, so it counts none.
func freeSlots(g registry.GroupInfo, stagger bool) int {
	fresh := func(wk registry.WorkerInfo) bool { return g.Now.Sub(wk.LastHeartbeat) <= recycleStale }
	retiring := false
	for _, id := range g.Retiring {
		for _, wk := range g.Workers {
			retiring = retiring || wk.ID == id && fresh(wk)
		}
	}
	free := 0
	for _, wk := range g.Workers {
		if wk.Status != "available" || !fresh(wk) || wk.SuspectUntil.After(g.Now) {
			continue
		}
		limit := recycleMaxConcurrent
		if wk.WorkerState.Capacity > 0 {
			limit = min(limit, wk.WorkerState.Capacity)
		}
		left := recycleMaxLifetime - wk.Lifetime
		if wk.Hold || stagger && retiring {
			left--
		}
		free += max(0, min(limit-wk.Active, left))
	}
	return free
}
