package main

// The redis-targets section (issue 12): every target of the registry
// redesign, each printed beside a baseline measured in the same run, with
// whether it is met. Nothing here fails the run: the figures are reports.
//
//   - Redis time per claim at N workers (lifetime_first, vnode K=2,
//     fair_share) and per release, from INFO commandstats deltas
//     (evalsha, eval and fcall together), beside PING's usec_per_call;
//     the nested commands per claim and release come from the same deltas.
//   - Through bin/caddy with W fakebrowser workers, S sessions C at once:
//     Redis CPU per session (INFO cpu, user + sys, whole process, each
//     printed), and every command's calls and time per session; measured
//     twice, everything on shared cores, then with Redis alone on a core
//     (pin_linux.go says why).
//   - Client-visible claim p50 (Registry.Claim) against a PING p50, taken
//     interleaved on one connection.
//   - Connect p50 through the grid against stock reverse_proxy least_conn
//     over the same workers, interleaved.
//   - Decisions per second on one Redis from two claiming processes
//     (gridbench re-executing itself with -claimer), beside the PINGs per
//     second the same two processes reach, and beside the same claims
//     with every call its own FCALL (registry.Options.MaxBatch 1, as
//     before a busy pool's calls were batched), the two in turns so that
//     both meet the machine's slow and fast phases (tgtTurns); again with
//     Redis alone on a core, with how busy Redis was, its CPU per decision
//     and the FCALLs per decision.
//   - Stock reverse_proxy least_conn with 1,000 and 10,000 static upstreams
//     beside the grid over the same workers: sessions/s and connect p50 at
//     4 and 64 clients, with how busy Redis was during the grid's cell.
//
//	gridbench -only redis                       # the sizes (several minutes)
//	gridbench -only redis -redis-n 2000 -redis-for 2s -redis-stock-n 1000
//	gridbench -only redis -redis-pprof /tmp/caddy.pprof   # also profile bin/caddy
//	gridbench -only redis -quick                # a smoke run, figures not meaningful

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

func init() {
	register(section{name: "redis-targets", order: 40, run: runTargets})
}

// The section's knobs; the defaults are the sizes.
var (
	tgtN        = flag.Int("redis-n", 10_000, "redis-targets: workers in the pool for the script costs, the claim p50 and the two claiming processes")
	tgtBatch    = flag.Int("redis-batch", 200, "redis-targets: claims outstanding between two commandstats samples")
	tgtRounds   = flag.Int("redis-rounds", 10, "redis-targets: batches per policy (claims per policy = batch × rounds)")
	tgtSamples  = flag.Int("redis-samples", 2000, "redis-targets: interleaved PING / claim samples for the client-visible p50")
	tgtWorkers  = flag.Int("redis-workers", 8, "redis-targets: fakebrowser workers behind bin/caddy for the per-session figures")
	tgtSessions = flag.Int("redis-sessions", 1000, "redis-targets: sessions through bin/caddy for Redis CPU per session")
	tgtClients  = flag.Int("redis-clients", 4, "redis-targets: clients at once for those sessions")
	tgtConnects = flag.Int("redis-connects", 400, "redis-targets: connects per path for the connect p50")
	tgtFor      = flag.Duration("redis-for", 5*time.Second, "redis-targets: length of each sessions/s cell and of the claiming processes' run")
	tgtConns    = flag.Int("redis-claimer-conns", 8, "redis-targets: connections (goroutines) per claiming process")
	tgtStockN   = flag.String("redis-stock-n", "1000,10000", "redis-targets: pool sizes for grid vs stock reverse_proxy (comma separated; empty: skip)")
	tgtStockC   = flag.String("redis-stock-clients", "4,64", "redis-targets: client counts for grid vs stock reverse_proxy")
	tgtParts    = flag.String("redis-parts", "scripts,caddy,caddy-pinned,stock", "redis-targets: which parts to run (scripts: script costs, claim p50, claiming processes; caddy: through bin/caddy, all on shared cores; caddy-pinned: the same with Redis alone on the last CPU, everything else on the others; stock: grid vs stock)")
	tgtPprof    = flag.String("redis-pprof", "", "redis-targets: write CPU profiles of bin/caddy under C clients' load, grid to this file and stock reverse_proxy to it + \".stock\"; the caddy-pinned part to it + \".pinned\" and + \".pinned.stock\"")
	tgtPprofFor = flag.Duration("redis-pprof-for", 10*time.Second, "redis-targets: how long each CPU profile runs")
)

// The hidden claimer mode (a second OS process of gridbench).
var (
	claimerAddr   = flag.String("claimer", "", "internal (redis-targets): run as a claiming process against this Redis address")
	claimerPool   = flag.String("claimer-pool", "", "internal: pool to claim in")
	claimerMode   = flag.String("claimer-mode", "claim", "internal: claim (claim + release loop), claim-alone (the same, every call its own FCALL: MaxBatch 1) or ping")
	claimerStart  = flag.Int64("claimer-start", 0, "internal: start at this Unix time (ms)")
	claimerFor    = flag.Duration("claimer-for", time.Second, "internal: how long to run")
	claimerConnsF = flag.Int("claimer-conns", 8, "internal: connections")
)

// tgtLimits never refuse a claim (every claim is released before the
// batch's next few), and keep workers registered at the start fresh for
// the whole section however slow the machine.
var tgtLimits = selection.Limits{MaxConcurrent: 5, MaxLifetime: 1_000_000, StaleAfter: time.Hour, MaxScan: 16}

// tgtPartNames are the parts -redis-parts may name.
var tgtPartNames = []string{"scripts", "caddy", "caddy-pinned", "stock"}

// tgtRow is one line of the targets table.
type tgtRow struct {
	what, measured, baseline, ratio, goal, verdict string
}

func runTargets(cfg *config) error {
	w := cfg.out
	n, batch, rounds, samples := *tgtN, *tgtBatch, *tgtRounds, *tgtSamples
	workers, sessions, clients, connects, dur := *tgtWorkers, *tgtSessions, *tgtClients, *tgtConnects, *tgtFor
	stockN, err := tgtInts(*tgtStockN)
	if err != nil {
		return fmt.Errorf("-redis-stock-n: %w", err)
	}
	stockC, err := tgtInts(*tgtStockC)
	if err != nil {
		return fmt.Errorf("-redis-stock-clients: %w", err)
	}
	parts := strings.Split(*tgtParts, ",")
	for _, p := range parts {
		if !slices.Contains(tgtPartNames, p) {
			return fmt.Errorf("-redis-parts: unknown part %q (the parts are %s)", p, strings.Join(tgtPartNames, ", "))
		}
	}
	if cfg.quick {
		n, batch, rounds, samples = 300, 20, 2, 50
		sessions, connects, dur = 40, 20, 300*time.Millisecond
		stockN, stockC = []int{50}, []int{4}
	}
	fmt.Fprintf(w, "Sizes: N=%d, %d claims per policy in batches of %d, %d claim samples; %d workers, %d sessions %d at once, %d connects per path;\n",
		n, batch*rounds, batch, samples, workers, sessions, clients, connects)
	fmt.Fprintf(w, "%s per sessions/s cell and per claiming run; stock comparison at N=%v with %v clients.\n\n", dur, stockN, stockC)

	part := func(name string) bool { return slices.Contains(parts, name) }
	var rows []tgtRow
	if part("scripts") {
		r, err := tgtScripts(cfg, n, batch, rounds, samples, dur)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
	}
	for _, pinned := range []bool{false, true} {
		name := "caddy"
		if pinned {
			name = "caddy-pinned"
		}
		if !part(name) {
			continue
		}
		r, err := tgtThroughCaddy(cfg, workers, sessions, clients, connects, pinned)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
	}
	if part("stock") {
		if err := tgtStock(cfg, stockN, stockC, dur); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nTargets of issue 12 (each against a baseline measured in this run):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured | baseline (same run) | ratio | goal | verdict |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.what, r.measured, r.baseline, r.ratio, r.goal, r.verdict)
	}
	return nil
}

// tgtScripts measures the scripts in Redis at n workers, the client-visible
// claim, and two claiming processes.
func tgtScripts(cfg *config, n, batch, rounds, samples int, dur time.Duration) ([]tgtRow, error) {
	w := cfg.out
	reg, rdb, stop, err := regOpen()
	if err != nil {
		return nil, err
	}
	defer stop()
	ctx := context.Background()
	const pool = "targets"
	setup := time.Now()
	if err := regPopulate(ctx, reg, rdb, pool, n); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "(N=%d workers registered in %s)\n\n", n, time.Since(setup).Round(10*time.Millisecond))

	// PING inside Redis.
	s0, err := tgtCommandStats(ctx, rdb)
	if err != nil {
		return nil, err
	}
	for range 2000 {
		if err := rdb.Ping(ctx).Err(); err != nil {
			return nil, err
		}
	}
	s1, err := tgtCommandStats(ctx, rdb)
	if err != nil {
		return nil, err
	}
	ping := s1.sub(s0)["ping"]
	pingUS := ping.perCall()

	type cost struct {
		claim, release   cmdStats
		claims, releases int
	}
	policies := []registry.Policy{registry.LifetimeFirst, registry.Vnode, registry.FairShare}
	costs := map[registry.Policy]*cost{}
	for _, p := range policies {
		// One pool per policy, as a deployment has: a pool keeps only the
		// indexes of the policies that claim it (docs/redis.md, "Kept
		// indexes"), so claiming one pool with all three would measure
		// all three indexes kept.
		pool := pool
		if p != registry.LifetimeFirst {
			pool += "-" + string(p)
			if err := regPopulate(ctx, reg, rdb, pool, n); err != nil {
				return nil, err
			}
		}
		req := registry.ClaimRequest{Pool: pool, Policy: p, Limits: tgtLimits, Holder: "gridbench"}
		if p == registry.Vnode {
			req.Vnode.Samples = 2
		}
		// Warm up (Function cache, connections) until the pool's index
		// for the policy is complete (its first claims build it).
		for i := range 1000 {
			c, err := reg.Claim(ctx, req)
			if err != nil {
				return nil, fmt.Errorf("claim %s: %w", p, err)
			}
			if err := reg.Release(ctx, pool, c.LeaseID); err != nil {
				return nil, err
			}
			if i >= 9 && !c.IndexBuilding {
				break
			}
		}
		c := &cost{claim: cmdStats{}, release: cmdStats{}}
		for range rounds {
			a, err := tgtCommandStats(ctx, rdb)
			if err != nil {
				return nil, err
			}
			leases := make([]string, 0, batch)
			for range batch {
				cl, err := reg.Claim(ctx, req)
				if err != nil {
					return nil, fmt.Errorf("claim %s at N=%d: %w", p, n, err)
				}
				leases = append(leases, cl.LeaseID)
			}
			b, err := tgtCommandStats(ctx, rdb)
			if err != nil {
				return nil, err
			}
			for _, l := range leases {
				if err := reg.Release(ctx, pool, l); err != nil {
					return nil, fmt.Errorf("release %s: %w", p, err)
				}
			}
			d, err := tgtCommandStats(ctx, rdb)
			if err != nil {
				return nil, err
			}
			c.claim.add(b.sub(a))
			c.release.add(d.sub(b))
			c.claims += batch
			c.releases += batch
		}
		costs[p] = c
	}
	// Heartbeats, one per worker in turn (each renews the record and may
	// free expired leases of the pool).
	hb0, err := tgtCommandStats(ctx, rdb)
	if err != nil {
		return nil, err
	}
	hbs := batch * rounds
	for i := range hbs {
		if _, err := reg.Heartbeat(ctx, pool, fmt.Sprintf("w%05d", i%n), time.Hour); err != nil {
			return nil, fmt.Errorf("heartbeat at N=%d: %w", n, err)
		}
	}
	hb1, err := tgtCommandStats(ctx, rdb)
	if err != nil {
		return nil, err
	}
	heartbeat := hb1.sub(hb0)

	fmt.Fprintf(w, "Scripts in Redis at N=%d (INFO commandstats deltas; a script's time includes its nested commands; PING %s µs per call):\n\n", n, tgtF(pingUS, 2))
	fmt.Fprintln(w, "| script | µs per call | × PING | nested commands per call | nested µs per call | Lua's own µs (script − nested) | top nested commands (calls per call) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---|")
	var rows []tgtRow
	goals := map[registry.Policy]float64{registry.LifetimeFirst: 25, registry.Vnode: 40, registry.FairShare: 30}
	worstRelease := 0.0
	for _, p := range policies {
		c := costs[p]
		for _, ph := range []struct {
			name  string
			st    cmdStats
			count int
		}{{"claim " + string(p), c.claim, c.claims}, {"release (after " + string(p) + ")", c.release, c.releases}} {
			script := ph.st.scripts()
			nested := ph.st.nested()
			per := script.usec / float64(ph.count)
			nestedPer := nested.usec / float64(ph.count)
			fmt.Fprintf(w, "| %s | %s | %s× | %s | %s | %s | %s |\n", ph.name, tgtF(per, 1), tgtF(per/pingUS, 0),
				tgtF(nested.calls/float64(ph.count), 1), tgtF(nestedPer, 1), tgtF(per-nestedPer, 1), ph.st.top(6, float64(ph.count)))
		}
		if p == policies[len(policies)-1] {
			script, nested := heartbeat.scripts(), heartbeat.nested()
			per, nestedPer := script.usec/float64(hbs), nested.usec/float64(hbs)
			fmt.Fprintf(w, "| heartbeat | %s | %s× | %s | %s | %s | %s |\n", tgtF(per, 1), tgtF(per/pingUS, 0),
				tgtF(nested.calls/float64(hbs), 1), tgtF(nestedPer, 1), tgtF(per-nestedPer, 1), heartbeat.top(6, float64(hbs)))
		}
		per := c.claim.scripts().usec / float64(c.claims)
		name := string(p)
		if p == registry.Vnode {
			name = "vnode K=2"
		}
		rows = append(rows, tgtRow{"Redis time per claim, " + name + fmt.Sprintf(", N=%d", n), tgtF(per, 1) + " µs",
			"PING " + tgtF(pingUS, 2) + " µs", tgtF(per/pingUS, 0) + "×", "≤ " + tgtF(goals[p], 0) + " µs", regVerdict(per <= goals[p])})
		worstRelease = max(worstRelease, c.release.scripts().usec/float64(c.releases))
	}
	rows = append(rows, tgtRow{"Redis time per release (worst of the three)", tgtF(worstRelease, 1) + " µs", "PING " + tgtF(pingUS, 2) + " µs",
		tgtF(worstRelease/pingUS, 0) + "×", "≤ 10 µs", regVerdict(worstRelease <= 10)})

	// Client-visible claim against PING, interleaved on the same client.
	req := registry.ClaimRequest{Pool: pool, Policy: registry.LifetimeFirst, Limits: tgtLimits, Holder: "gridbench"}
	var pings, claims []time.Duration
	for range samples {
		t := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return nil, err
		}
		pings = append(pings, time.Since(t))
		t = time.Now()
		c, err := reg.Claim(ctx, req)
		if err != nil {
			return nil, err
		}
		claims = append(claims, time.Since(t))
		if err := reg.Release(ctx, pool, c.LeaseID); err != nil {
			return nil, err
		}
	}
	pp, cp := proxyQuantile(pings, 0.5), proxyQuantile(claims, 0.5)
	fmt.Fprintf(w, "\nClient-visible (go-redis, one connection, %d interleaved samples, lifetime_first at N=%d): claim p50 %s µs (p90 %s), PING p50 %s µs (p90 %s).\n",
		samples, n, proxyUS(cp), proxyUS(proxyQuantile(claims, 0.9)), proxyUS(pp), proxyUS(proxyQuantile(pings, 0.9)))
	rows = append(rows, tgtRow{"Client-visible claim p50 (lifetime_first)", proxyUS(cp) + " µs", "PING p50 " + proxyUS(pp) + " µs",
		tgtF(float64(cp)/float64(pp), 2) + "×", "≤ 3× PING", regVerdict(float64(cp) <= 3*float64(pp))})

	// Two claiming processes, batched and with every call its own FCALL
	// (MaxBatch 1, as before batching) in turns (tgtTurns), then the same
	// two sending PINGs.
	claimers := func(mode string, d time.Duration) (float64, error) {
		return tgtClaimers(rdb.Options().Addr, pool, mode, d)
	}
	both, err := tgtTurns([]string{"claim", "claim-alone"}, dur, claimers, func(a, b float64) float64 { return a + b })
	if err != nil {
		return nil, err
	}
	dec, alone := both[0]/tgtTurnsN, both[1]/tgtTurnsN
	pps, err := tgtClaimers(rdb.Options().Addr, pool, "ping", dur)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "Two claiming processes, %d connections each, %s, lifetime_first at N=%d: %s decisions/s (claim + release each; %s/s with every call its own FCALL, %s× batched/alone, the two in %d turns each); the same two sending PINGs: %s/s.\n",
		*tgtConns, dur, n, tgtF(dec, 0), tgtF(alone, 0), tgtF(dec/alone, 2), tgtTurnsN, tgtF(pps, 0))
	rows = append(rows, tgtRow{fmt.Sprintf("Decisions/s, two claiming processes, N=%d", n), tgtF(dec, 0) + "/s", "PINGs " + tgtF(pps, 0) + "/s",
		tgtF(dec/pps, 2) + "×", "≥ 20,000/s", regVerdict(dec >= 20000)})

	// The same with Redis alone on a core (pin_linux.go): the claiming
	// processes, started from a pinned gridbench, stay on the others.
	const pinnedWhat = "decisions/s with Redis alone on a core"
	pid, err := tgtRedisPid(ctx, rdb)
	if err != nil {
		fmt.Fprintf(w, "(%s skipped: %v)\n", pinnedWhat, err)
		return rows, nil
	}
	where, restore, ok := tgtPin(w, pinnedWhat, pid)
	if !ok {
		return rows, nil
	}
	defer restore()
	// one run of the two processes in a mode: ops/s, how busy Redis was
	// (CPU s per s) and the FCALLs it ran
	type pinnedRun struct {
		ops, busy float64
		calls     cmdStat
	}
	measure := func(mode string, dur time.Duration) (pinnedRun, error) {
		var m pinnedRun
		c0, err := tgtRedisCPU(ctx, rdb)
		if err != nil {
			return m, err
		}
		s0, err := tgtCommandStats(ctx, rdb)
		if err != nil {
			return m, err
		}
		if m.ops, err = tgtClaimers(rdb.Options().Addr, pool, mode, dur); err != nil {
			return m, err
		}
		s1, err := tgtCommandStats(ctx, rdb)
		if err != nil {
			return m, err
		}
		c1, err := tgtRedisCPU(ctx, rdb)
		if err != nil {
			return m, err
		}
		m.busy, m.calls = c1.sub(c0).total()/dur.Seconds(), s1.sub(s0).scripts()
		return m, nil
	}
	turns, err := tgtTurns([]string{"claim", "claim-alone"}, dur, measure, func(a, b pinnedRun) pinnedRun {
		return pinnedRun{a.ops + b.ops, a.busy + b.busy, cmdStat{a.calls.calls + b.calls.calls, a.calls.usec + b.calls.usec}}
	})
	if err != nil {
		return nil, err
	}
	// each turn's ops/s and busy are rates over a turn: their mean is the
	// whole run's; the calls add up
	for i := range turns {
		turns[i].ops, turns[i].busy = turns[i].ops/tgtTurnsN, turns[i].busy/tgtTurnsN
	}
	batched, lone := turns[0], turns[1]
	pinged, err := measure("ping", dur)
	if err != nil {
		return nil, err
	}
	// per decision: Redis CPU, FCALLs and µs inside them
	per := func(m pinnedRun) string {
		n := m.ops * dur.Seconds()
		return fmt.Sprintf("%s µs of Redis CPU per decision, %s FCALLs and %s µs inside them",
			tgtF(m.busy/m.ops*1e6, 0), tgtF(m.calls.calls/n, 2), tgtF(m.calls.usec/n, 0))
	}
	fmt.Fprintf(w, "The same, %s: %s decisions/s, Redis %s%% of its core busy (%s); every call its own FCALL: %s/s, %s%% busy (%s), %s× batched/alone; PINGs: %s/s, Redis %s%% busy.\n",
		where, tgtF(batched.ops, 0), tgtF(batched.busy*100, 0), per(batched), tgtF(lone.ops, 0), tgtF(lone.busy*100, 0), per(lone),
		tgtF(batched.ops/lone.ops, 2), tgtF(pinged.ops, 0), tgtF(pinged.busy*100, 0))
	rows = append(rows, tgtRow{fmt.Sprintf("Decisions/s, two claiming processes, N=%d (%s)", n, where), tgtF(batched.ops, 0) + "/s", "PINGs " + tgtF(pinged.ops, 0) + "/s",
		tgtF(batched.ops/pinged.ops, 2) + "×", "≥ 20,000/s", regVerdict(batched.ops >= 20000)})
	return rows, nil
}

// tgtTurnsN is how many turns tgtTurns gives each mode.
const tgtTurnsN = 3

// tgtTurns runs run(mode, dur/tgtTurnsN) for each of modes in turn,
// tgtTurnsN times round, and returns each mode's results added up (add,
// starting from T's zero value), in the order of modes. Run one after the other, a mode measured first
// and one measured second met different phases of this VM, which move a
// run by a third (docs/perf/registry-profile.md, "Busy pools"); in turns
// each meets them alike.
func tgtTurns[T any](modes []string, dur time.Duration, run func(mode string, d time.Duration) (T, error), add func(a, b T) T) ([]T, error) {
	out := make([]T, len(modes))
	for range tgtTurnsN {
		for i, mode := range modes {
			r, err := run(mode, dur/tgtTurnsN)
			if err != nil {
				return nil, err
			}
			out[i] = add(out[i], r)
		}
	}
	return out, nil
}

// tgtPin pins Redis apart from the others and this process
// (pin_linux.go) and returns where Redis runs and how to undo it. When it
// cannot, it prints why the figures named by what are skipped and returns
// ok false: a report, not a failure, since the rest of the run stands
// without them.
func tgtPin(w io.Writer, what string, redis int, others ...int) (where string, restore func(), ok bool) {
	pin, err := pinApart(redis, others...)
	if err != nil {
		fmt.Fprintf(w, "\n(%s skipped: %v)\n", what, err)
		return "", nil, false
	}
	return fmt.Sprintf("Redis alone on CPU %d", pin.redisCPU), func() {
		if err := pin.restore(); err != nil {
			fmt.Fprintf(w, "(restoring CPU sets after %s: %v)\n", what, err)
		}
	}, true
}

// tgtRedisPid returns the process id of the Redis behind rdb, which must
// be the one this process started (its child): a server that took the
// port first is someone else's, not to be pinned.
func tgtRedisPid(ctx context.Context, rdb *redis.Client) (int, error) {
	txt, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return 0, fmt.Errorf("reading INFO server: %w", err)
	}
	for _, line := range strings.Split(txt, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(v)
		if err != nil {
			return 0, fmt.Errorf("INFO server process_id %q: %w", v, err)
		}
		if parent := tgtParent(pid); parent != os.Getpid() {
			return 0, fmt.Errorf("the Redis at %s (pid %d, parent %d) is not the one gridbench started", rdb.Options().Addr, pid, parent)
		}
		return pid, nil
	}
	return 0, errors.New("INFO server has no process_id")
}

// tgtParent returns a process' parent id from /proc, or 0 where there is
// none.
func tgtParent(pid int) int {
	f := tgtProcStat(pid)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// tgtProcStat returns the fields of /proc/<pid>/stat after the command
// name (f[0] is the state), or none where there is no such file.
func tgtProcStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

// tgtClaimers runs two gridbench processes in claimer mode against addr
// and returns their summed operations per second.
func tgtClaimers(addr, pool, mode string, dur time.Duration) (float64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	start := time.Now().Add(1500 * time.Millisecond).UnixMilli()
	type result struct {
		out []byte
		err error
	}
	res := make(chan result, 2)
	for range 2 {
		go func() {
			cmd := exec.Command(exe, "-claimer", addr, "-claimer-pool", pool, "-claimer-mode", mode,
				"-claimer-start", strconv.FormatInt(start, 10), "-claimer-for", dur.String(), "-claimer-conns", strconv.Itoa(*tgtConns))
			out, err := cmd.Output()
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				err = fmt.Errorf("%w: %s", err, ee.Stderr)
			}
			res <- result{out, err}
		}()
	}
	total := 0.0
	for range 2 {
		r := <-res
		if r.err != nil {
			return 0, fmt.Errorf("claiming process (%s): %w", mode, r.err)
		}
		var got struct{ Ops, Seconds float64 }
		if err := json.Unmarshal(r.out, &got); err != nil {
			return 0, fmt.Errorf("claiming process said %q: %w", r.out, err)
		}
		total += got.Ops / got.Seconds
	}
	return total, nil
}

// claimerMain is a claiming process: from -claimer-start for -claimer-for,
// -claimer-conns goroutines claim and release (or PING) in a loop; it
// prints {"Ops": n, "Seconds": s} and returns the exit code.
func claimerMain() int {
	rdb := redis.NewClient(&redis.Options{Addr: *claimerAddr, PoolSize: *claimerConnsF})
	defer rdb.Close()
	opts := registry.Options{NoStaleExpiry: true}
	if *claimerMode == "claim-alone" {
		opts.MaxBatch = 1
	}
	reg := registry.New(rdb, opts)
	ctx := context.Background()
	req := registry.ClaimRequest{Pool: *claimerPool, Policy: registry.LifetimeFirst, Limits: tgtLimits, Holder: "gridbench-claimer"}
	op := func() error {
		c, err := reg.Claim(ctx, req)
		if err != nil {
			return err
		}
		return reg.Release(ctx, *claimerPool, c.LeaseID)
	}
	if *claimerMode == "ping" {
		op = func() error { return rdb.Ping(ctx).Err() }
	}
	if err := op(); err != nil { // warm up: connection, EVALSHA cache
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	time.Sleep(time.Until(time.UnixMilli(*claimerStart)))
	begin := time.Now()
	end := begin.Add(*claimerFor)
	var ops atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range *claimerConnsF {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if err := op(); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out, _ := json.Marshal(struct{ Ops, Seconds float64 }{float64(ops.Load()), time.Since(begin).Seconds()})
	fmt.Println(string(out))
	return 0
}

// tgtThroughCaddy measures per-session Redis CPU and commands through
// bin/caddy, and the connect p50 against stock reverse_proxy.
func tgtThroughCaddy(cfg *config, workers, sessions, clients, connects int, pinned bool) ([]tgtRow, error) {
	w := cfg.out
	ctx := context.Background()
	srv, err := regStartRedis()
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 8})
	defer rdb.Close()
	const pool = "bench"
	fleet, err := tgtFleet(ctx, rdb, pool, workers)
	if err != nil {
		return nil, err
	}
	defer fleet.Close()
	cad, err := startCaddySites(srv.addr, pool, fleet.endpoints)
	if err != nil {
		return nil, err
	}
	defer cad.stop()
	where := "shared cores"
	if pinned {
		at, restore, ok := tgtPin(w, "caddy-pinned", srv.cmd.Process.Pid, cad.cmd.Process.Pid)
		if !ok {
			return nil, nil
		}
		defer restore()
		where = at
	}
	grid := func() string { return "ws://" + cad.gridAddr + "/playwright/" + pool }
	stock := func() string { return "ws://" + cad.rpAddr + "/playwright" }
	for _, u := range []func() string{grid, stock} {
		if _, _, err := tgtLoad(u, 2, 40, 0); err != nil {
			return nil, fmt.Errorf("warming up: %w (caddy log: %s)", err, cad.logTail())
		}
	}

	// Baseline: Redis CPU per PING round trip with as many clients.
	pingCPU, err := tgtPingCPU(ctx, rdb, clients, sessions*20)
	if err != nil {
		return nil, err
	}

	// The grid's sessions.
	cpu0, err := tgtRedisCPU(ctx, rdb)
	if err != nil {
		return nil, err
	}
	st0, err := tgtCommandStats(ctx, rdb)
	if err != nil {
		return nil, err
	}
	cad0 := tgtProcCPU(cad.cmd.Process.Pid)
	lat, took, err := tgtLoad(grid, clients, sessions, 0)
	if err != nil {
		return nil, fmt.Errorf("grid sessions: %w (caddy log: %s)", err, cad.logTail())
	}
	cad1 := tgtProcCPU(cad.cmd.Process.Pid)
	// Releases run in Caddy after the client's close: wait until every
	// lease has ended before reading the counters (lease_owner holds one
	// entry per live lease; leases also holds ended ones' tombstones).
	owners := "{grid:" + pool + "}:lease_owner"
	for deadline := time.Now().Add(10 * time.Second); ; {
		l, err := rdb.ZCard(ctx, owners).Result()
		if err != nil {
			return nil, err
		}
		if l == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	st1, err := tgtCommandStats(ctx, rdb)
	if err != nil {
		return nil, err
	}
	cpu1, err := tgtRedisCPU(ctx, rdb)
	if err != nil {
		return nil, err
	}
	perSession := cpu1.sub(cpu0).per(sessions)
	d := st1.sub(st0)
	delete(d, "info")

	// The same sessions through stock reverse_proxy, for Caddy's CPU.
	rc0 := tgtProcCPU(cad.cmd.Process.Pid)
	slat, stook, err := tgtLoad(stock, clients, sessions, 0)
	if err != nil {
		return nil, fmt.Errorf("reverse_proxy sessions: %w", err)
	}
	rc1 := tgtProcCPU(cad.cmd.Process.Pid)

	fmt.Fprintf(w, "\nThrough bin/caddy, %d fakebrowser workers, %d sessions %d at once (connect + close each), %s:\n\n", workers, sessions, clients, where)
	fmt.Fprintln(w, "| path | sessions/s | connect p50 (µs) | Caddy CPU per session (µs, /proc) | Redis CPU per session (µs, INFO cpu: user + sys) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	fmt.Fprintf(w, "| browser_grid | %s | %s | %s | %s |\n", tgtF(float64(sessions)/took.Seconds(), 0), regUS(proxyQuantile(lat, 0.5)),
		tgtF((cad1-cad0)*1e6/float64(sessions), 0), perSession.split(0))
	fmt.Fprintf(w, "| reverse_proxy least_conn | %s | %s | %s | — |\n", tgtF(float64(sessions)/stook.Seconds(), 0), regUS(proxyQuantile(slat, 0.5)),
		tgtF((rc1-rc0)*1e6/float64(sessions), 0))
	fmt.Fprintf(w, "\nRedis commands per grid session (commandstats delta / %d sessions; scripts include their nested commands):\n\n", sessions)
	fmt.Fprintln(w, "| command | calls per session | µs per session | µs per call |")
	fmt.Fprintln(w, "|---|---:|---:|---:|")
	names := make([]string, 0, len(d))
	for k := range d {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return d[names[i]].usec > d[names[j]].usec })
	for _, k := range names {
		s := d[k]
		if s.calls == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", k, tgtF(s.calls/float64(sessions), 2), tgtF(s.usec/float64(sessions), 1), tgtF(s.perCall(), 2))
	}
	if *tgtPprof != "" {
		path := *tgtPprof
		if pinned { // beside the shared part's profiles, not over them
			path += ".pinned"
		}
		for _, p := range []struct {
			name, path string
			url        func() string
		}{{"browser_grid", path, grid}, {"reverse_proxy least_conn", path + ".stock", stock}} {
			n, err := tgtProfile(cad.adminAddr, p.path, p.url, clients, *tgtPprofFor)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(w, "\nCPU profile of bin/caddy, %s, %d clients, %s, %s: %d sessions; %s (go tool pprof -top bin/caddy %s).\n",
				p.name, clients, *tgtPprofFor, where, n, p.path, p.path)
		}
	}

	// Connect p50, one client, the two paths interleaved.
	var gl, sl []time.Duration
	for range connects {
		dg, err := proxyConnect(grid())
		if err != nil {
			return nil, err
		}
		ds, err := proxyConnect(stock())
		if err != nil {
			return nil, err
		}
		gl, sl = append(gl, dg), append(sl, ds)
	}
	gp, sp := proxyQuantile(gl, 0.5), proxyQuantile(sl, 0.5)
	fmt.Fprintf(w, "\nConnect, one client, %d per path interleaved, %s: grid p50 %s µs, reverse_proxy least_conn p50 %s µs.\n", connects, where, regUS(gp), regUS(sp))

	return []tgtRow{
		{fmt.Sprintf("Redis CPU per session through bin/caddy (%d workers, %d sessions, %d at once; %s)", workers, sessions, clients, where),
			perSession.split(0) + " µs", "per PING round trip " + pingCPU.split(1) + " µs", tgtF(perSession.total()/pingCPU.total(), 1) + "×",
			"≤ 60 µs", regVerdict(perSession.total() <= 60)},
		{"Connect p50 through the grid (" + where + ")", regUS(gp) + " µs", "reverse_proxy least_conn " + regUS(sp) + " µs", tgtF(float64(gp)/float64(sp), 2) + "×",
			"≤ 1.1×", regVerdict(float64(gp) <= 1.1*float64(sp))},
	}, nil
}

// tgtStock compares the grid with stock reverse_proxy least_conn over n
// static upstreams, for each n and client count.
func tgtStock(cfg *config, sizes, clientCounts []int, dur time.Duration) error {
	if len(sizes) == 0 {
		return nil
	}
	w := cfg.out
	ctx := context.Background()
	fmt.Fprintf(w, "\nGrid vs stock reverse_proxy least_conn over the same N fakebrowser workers (static upstreams), %s per cell, grid first:\n\n", dur)
	fmt.Fprintln(w, "| N | clients | grid sessions/s | stock sessions/s | grid / stock | grid connect p50 (µs) | stock connect p50 (µs) | grid / stock | Redis busy during grid |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, n := range sizes {
		if err := func() error {
			srv, err := regStartRedis()
			if err != nil {
				return err
			}
			defer srv.stop()
			rdb := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 8})
			defer rdb.Close()
			pool := fmt.Sprintf("stock%d", n)
			fleet, err := tgtFleet(ctx, rdb, pool, n)
			if err != nil {
				return err
			}
			defer fleet.Close()
			cad, err := startCaddySites(srv.addr, pool, fleet.endpoints)
			if err != nil {
				return err
			}
			defer cad.stop()
			grid := func() string { return "ws://" + cad.gridAddr + "/playwright/" + pool }
			stock := func() string { return "ws://" + cad.rpAddr + "/playwright" }
			for _, u := range []func() string{grid, stock} {
				if _, _, err := tgtLoad(u, 2, 40, 0); err != nil {
					return fmt.Errorf("warming up at N=%d: %w (caddy log: %s)", n, err, cad.logTail())
				}
			}
			for _, c := range clientCounts {
				cpu0, err := tgtRedisCPU(ctx, rdb)
				if err != nil {
					return err
				}
				gl, gt, err := tgtLoad(grid, c, 0, dur)
				if err != nil {
					return fmt.Errorf("grid at N=%d, %d clients: %w (caddy log: %s)", n, c, err, cad.logTail())
				}
				cpu1, err := tgtRedisCPU(ctx, rdb)
				if err != nil {
					return err
				}
				sl, st, err := tgtLoad(stock, c, 0, dur)
				if err != nil {
					return fmt.Errorf("stock at N=%d, %d clients: %w", n, c, err)
				}
				gs, ss := float64(len(gl))/gt.Seconds(), float64(len(sl))/st.Seconds()
				gp, sp := proxyQuantile(gl, 0.5), proxyQuantile(sl, 0.5)
				fmt.Fprintf(w, "| %d | %d | %s | %s | %s× | %s | %s | %s× | %s%% of a core |\n", n, c, tgtF(gs, 0), tgtF(ss, 0), tgtF(gs/ss, 2),
					regUS(gp), regUS(sp), tgtF(float64(gp)/float64(sp), 2), tgtF(cpu1.sub(cpu0).total()/gt.Seconds()*100, 0))
			}
			return nil
		}(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\nGoal: the grid's sessions/s reach stock's wherever Redis, not the machine's cores, is the limit (Redis near 100% of a core).")
	return nil
}

// tgtFleetT is n fakebrowser listeners served by one fake server.
type tgtFleetT struct {
	srv       *fake.Server
	endpoints []*url.URL
}

func (f *tgtFleetT) Close() { _ = f.srv.Close() }

// tgtFleet starts n fakebrowser listeners and registers each as a worker of
// pool.
func tgtFleet(ctx context.Context, rdb *redis.Client, pool string, n int) (*tgtFleetT, error) {
	f := &tgtFleetT{srv: fake.New(fake.Options{Path: "/playwright"})}
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("listening for fakebrowser %d of %d: %w", i, n, err)
		}
		go f.srv.Serve(l)
		f.endpoints = append(f.endpoints, &url.URL{Scheme: "ws", Host: l.Addr().String(), Path: "/playwright"})
	}
	reg := registry.New(rdb, registry.Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				u := f.endpoints[i]
				err := reg.Register(ctx, registry.Registration{Pool: pool, ID: fmt.Sprintf("w%05d", i), BrowserType: "chromium",
					Addr: u.Host, Path: u.Path, TTL: time.Hour})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		f.Close()
		return nil, fmt.Errorf("registering %d fakebrowser workers: %w", n, err)
	}
	return f, nil
}

// tgtLoad opens and closes sessions from clients goroutines: total of them
// (total > 0) or for d. It returns each connect's latency and the time the
// whole run took.
func tgtLoad(u func() string, clients, total int, d time.Duration) ([]time.Duration, time.Duration, error) {
	var left atomic.Int64
	left.Store(int64(total))
	start := time.Now()
	end := start.Add(d)
	lats := make([][]time.Duration, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if total > 0 {
					if left.Add(-1) < 0 {
						return
					}
				} else if time.Now().After(end) {
					return
				}
				lat, err := proxyConnect(u())
				if err != nil {
					errs[c] = err
					return
				}
				lats[c] = append(lats[c], lat)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	if len(all) == 0 {
		return nil, 0, errors.New("no session completed")
	}
	return all, took, nil
}

// tgtPingCPU returns Redis' CPU (µs, user and sys) per PING round trip from clients
// connections sending n PINGs in all.
func tgtPingCPU(ctx context.Context, rdb *redis.Client, clients, n int) (redisCPU, error) {
	c0, err := tgtRedisCPU(ctx, rdb)
	if err != nil {
		return redisCPU{}, err
	}
	var wg sync.WaitGroup
	var left atomic.Int64
	left.Store(int64(n))
	errs := make([]error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				if err := rdb.Ping(ctx).Err(); err != nil {
					errs[c] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return redisCPU{}, err
	}
	c1, err := tgtRedisCPU(ctx, rdb)
	if err != nil {
		return redisCPU{}, err
	}
	return c1.sub(c0).per(n), nil
}

// tgtProfile fetches a CPU profile of Caddy from its admin API into path
// while clients open sessions at u for about as long, and returns how many
// sessions were opened.
func tgtProfile(admin, path string, u func() string, clients int, d time.Duration) (int, error) {
	secs := max(1, int(d.Seconds()))
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs))
		if err != nil {
			done <- fmt.Errorf("profiling caddy: %w", err)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			done <- fmt.Errorf("profiling caddy: %s", resp.Status)
			return
		}
		f, err := os.Create(path)
		if err != nil {
			done <- err
			return
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			done <- fmt.Errorf("writing the profile: %w", err)
			return
		}
		done <- f.Close()
	}()
	// The profile starts when Caddy reads the request; the load stays
	// inside its window.
	time.Sleep(100 * time.Millisecond)
	lat, _, err := tgtLoad(u, clients, 0, time.Duration(secs)*time.Second-300*time.Millisecond)
	if err != nil {
		return 0, err
	}
	return len(lat), <-done
}

// cmdStat is one command's INFO commandstats line.
type cmdStat struct{ calls, usec float64 }

func (s cmdStat) perCall() float64 {
	if s.calls == 0 {
		return 0
	}
	return s.usec / s.calls
}

type cmdStats map[string]cmdStat

func (a cmdStats) sub(b cmdStats) cmdStats {
	out := cmdStats{}
	for k, v := range a {
		out[k] = cmdStat{v.calls - b[k].calls, v.usec - b[k].usec}
	}
	return out
}

func (a cmdStats) add(b cmdStats) {
	for k, v := range b {
		s := a[k]
		a[k] = cmdStat{s.calls + v.calls, s.usec + v.usec}
	}
}

// tgtScriptCmds are the commands that run a script; every other command
// counted while scripts run is nested in one (the bench sends nothing
// else but INFO).
var tgtScriptCmds = []string{"evalsha", "eval", "fcall", "evalsha_ro", "eval_ro", "fcall_ro"}

func (a cmdStats) scripts() cmdStat {
	var s cmdStat
	for _, k := range tgtScriptCmds {
		s.calls += a[k].calls
		s.usec += a[k].usec
	}
	return s
}

func (a cmdStats) nested() cmdStat {
	var s cmdStat
	for k, v := range a {
		if k == "info" || k == "ping" || slices.Contains(tgtScriptCmds, k) {
			continue
		}
		s.calls += v.calls
		s.usec += v.usec
	}
	return s
}

// top names the n nested commands with the most time, with their calls per
// unit.
func (a cmdStats) top(n int, per float64) string {
	var ks []string
	for k, v := range a {
		if k != "info" && k != "ping" && !slices.Contains(tgtScriptCmds, k) && v.calls > 0 {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return a[ks[i]].usec > a[ks[j]].usec })
	var parts []string
	for _, k := range ks[:min(n, len(ks))] {
		parts = append(parts, fmt.Sprintf("%s %s (%s µs)", k, tgtF(a[k].calls/per, 1), tgtF(a[k].usec/per, 1)))
	}
	return strings.Join(parts, ", ")
}

func tgtCommandStats(ctx context.Context, rdb *redis.Client) (cmdStats, error) {
	txt, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("reading INFO commandstats: %w", err)
	}
	out := cmdStats{}
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, fields, _ := strings.Cut(rest, ":")
		var s cmdStat
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				s.calls = x
			case "usec":
				s.usec = x
			}
		}
		out[strings.ReplaceAll(name, "|", " ")] = s
	}
	return out, nil
}

// redisCPU is Redis' CPU seconds from INFO cpu (whole process): user is
// Redis' own code (commands, Lua), sys the kernel's work for it (sockets,
// epoll, being woken). A figure per session or per PING is a difference
// of two readings (sub) scaled (per). The total is exact; with tick CPU
// accounting the split is sampled once per tick (4 ms at HZ=250), so it
// means something only over many ticks of Redis CPU.
type redisCPU struct{ user, sys float64 }

func (c redisCPU) total() float64 { return c.user + c.sys }

func (c redisCPU) sub(o redisCPU) redisCPU { return redisCPU{c.user - o.user, c.sys - o.sys} }

// per returns the CPU in µs per one of n.
func (c redisCPU) per(n int) redisCPU {
	return redisCPU{c.user * 1e6 / float64(n), c.sys * 1e6 / float64(n)}
}

// split prints "total (user u, sys s)" in µs with prec decimals.
func (c redisCPU) split(prec int) string {
	return tgtF(c.total(), prec) + " (user " + tgtF(c.user, prec) + ", sys " + tgtF(c.sys, prec) + ")"
}

// tgtRedisCPU returns Redis' CPU seconds so far.
func tgtRedisCPU(ctx context.Context, rdb *redis.Client) (redisCPU, error) {
	txt, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return redisCPU{}, fmt.Errorf("reading INFO cpu: %w", err)
	}
	var c redisCPU
	seen := 0
	for _, line := range strings.Split(txt, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		var dst *float64
		switch k {
		case "used_cpu_user":
			dst = &c.user
		case "used_cpu_sys":
			dst = &c.sys
		default:
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return redisCPU{}, fmt.Errorf("INFO cpu %s=%q: %w", k, v, err)
		}
		*dst = x
		seen++
	}
	if seen != 2 {
		return redisCPU{}, errors.New("INFO cpu has no used_cpu_user and used_cpu_sys")
	}
	return c, nil
}

// tgtProcCPU returns a process' CPU seconds (user + sys) from /proc, or 0
// where there is none.
func tgtProcCPU(pid int) float64 {
	f := tgtProcStat(pid)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / 100 // USER_HZ is 100 on Linux
}

func tgtInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func tgtF(x float64, prec int) string { return strconv.FormatFloat(x, 'f', prec, 64) }
