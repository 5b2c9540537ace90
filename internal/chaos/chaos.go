// Package chaos runs the grid's reliability scenarios: each starts real parts (redis-server, or a Redis Cluster with replicas,
// or Redis Sentinel; bin/caddy; bin/grid-worker agents running
// fakebrowser), drives client traffic through Caddy, injects one fault
// under that traffic, and measures from outside what clients saw and what
// the grid's counts were, against what must hold: every session served
// except those on the component the fault killed, no slot leaked, no
// browser over max_concurrent, no session past max_lifetime, and the
// grid healed within the scenario's bound.
//
// cmd/gridchaos prints the table; `make chaos` runs it.
package chaos

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Options configure a run.
type Options struct {
	// Bins is the directory holding caddy, grid-worker and fakebrowser
	// (`make build`). Default: "bin".
	Bins string
	// Short runs the short form: the same scenarios and expectations with
	// shorter phases (make test runs it).
	Short bool
	// Only runs the scenarios whose name contains one of these
	// comma-separated words. Default: every scenario.
	Only string
	// Dir keeps every scenario's files (logs, Caddyfiles, Redis dirs)
	// under it. Default: a temp dir, removed when the run passes.
	Dir string
	// Log receives progress lines. Default: discarded.
	Log io.Writer
}

// Result is one row of the table.
type Result struct {
	Scenario string
	// Tried, Served and Errors count client sessions: served means opened
	// and ended by the client as planned; errors are the failures the
	// client saw that the fault does not excuse; Excused are the sessions
	// that were on the killed or stalled component.
	Tried, Served, Errors, Excused int
	// Leaked is how many slots Redis still held beyond the live sessions
	// once traffic had stopped and two heartbeats had passed (-1: Redis
	// could not be read).
	Leaked int
	// OverAdmissions is the sessions browsers held at once beyond their
	// max_concurrent (summed over browsers, each at its worst moment).
	OverAdmissions int
	// Overshoots is the sessions that began on a browser already at the
	// max_lifetime in force.
	Overshoots int
	// Heal is the time from the fault to the first moment from which the
	// counts stayed right and sessions were served; Healed false: never
	// within the run.
	Heal      time.Duration
	Healed    bool
	HealBound time.Duration
	// Notes are extra figures (promotion time, slowest refusal, ...).
	Notes []string
	// Failures name each figure that is off; empty: the scenario passed.
	Failures []string
	Took     time.Duration
}

// Passed reports whether every figure met its expectation.
func (r Result) Passed() bool { return len(r.Failures) == 0 }

// Scenario is one fault under traffic.
type Scenario struct {
	// Name is short and unique (-only matches it).
	Name string
	// Proves says what passing it shows (docs and -list).
	Proves string
	run    func(r *run) error
}

// Scenarios lists every scenario in the order they run.
func Scenarios() []Scenario { return scenarios }

// Run runs the selected scenarios one after another and returns their
// results.
func Run(ctx context.Context, opts Options) ([]Result, error) {
	if opts.Bins == "" {
		opts.Bins = "bin"
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	bins, err := filepath.Abs(opts.Bins)
	if err != nil {
		return nil, err
	}
	opts.Bins = bins
	for _, b := range []string{"caddy", "grid-worker", "fakebrowser"} {
		if _, err := os.Stat(filepath.Join(bins, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run 'make build' first", b, bins)
		}
	}
	for _, b := range []string{"redis-server", "redis-cli"} {
		if _, err := execLookPath(b); err != nil {
			return nil, fmt.Errorf("%s not found on PATH: run 'make deps' first", b)
		}
	}
	selected := selectScenarios(scenarios, opts.Only)
	if len(selected) == 0 {
		return nil, fmt.Errorf("no scenario matches %q (gridchaos -list shows them)", opts.Only)
	}
	root := opts.Dir
	ownRoot := root == ""
	if ownRoot {
		if root, err = os.MkdirTemp("", "gridchaos-"); err != nil {
			return nil, fmt.Errorf("creating the run's temp dir: %w", err)
		}
	}
	var results []Result
	failed := false
	for _, s := range selected {
		if ctx.Err() != nil {
			break
		}
		res := runOne(s, opts, filepath.Join(root, s.Name))
		if !res.Passed() {
			failed = true
		}
		results = append(results, res)
	}
	if ownRoot && !failed {
		_ = os.RemoveAll(root)
	} else {
		fmt.Fprintf(opts.Log, "gridchaos: logs kept in %s\n", root)
	}
	return results, nil
}

func runOne(s Scenario, opts Options, dir string) Result {
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(opts.Log, "%s %-20s %s\n", time.Now().UTC().Format("15:04:05.000"), s.Name, fmt.Sprintf(format, args...))
	}
	logf("starting")
	r := &run{name: s.Name, short: opts.Short, e: newEnv(opts.Bins, dir, logf), logf: logf, healBound: healBound}
	defer r.e.close()
	err := s.run(r)
	res := r.result()
	if err != nil {
		res.Failures = append([]string{"run: " + err.Error()}, res.Failures...)
		logf("error: %v", err)
	}
	res.Took = time.Since(start)
	logf("done in %s: %s", res.Took.Round(time.Millisecond), verdict(res))
	return res
}

func verdict(r Result) string {
	if r.Passed() {
		return "PASS"
	}
	return "FAIL: " + strings.Join(r.Failures, "; ")
}

// run is one scenario in progress: its world, its clients, its sampler
// and the faults it injected (which excuse what they broke).
type run struct {
	name  string
	short bool
	e     *env
	logf  func(string, ...any)
	reg   *registry.Registry
	tr    *traffic
	smp   *sampler

	faultAt   time.Time
	healBound time.Duration
	// outages: dial failures overlapping one are on the failed component.
	outages [][2]time.Time
	// swaps: the reloads' listener swaps, each from the reload's start
	// until its port had one listener again. Caddy binds the new config's
	// listeners beside the old ones (SO_REUSEPORT) and closes the old
	// ones as it answers the reload. A handshake sent to the old
	// listener by then can be cut before any answer: Linux resets those
	// still queued on it when it closes, and net/http closes unanswered a
	// connection whose request it reads once the old server's shutdown
	// has begun. Stock reverse_proxy loses them the same way; a handler
	// panic, which also closes unanswered, fails the run (result).
	swaps [][2]time.Time
	// killedFrontend[i]: when frontend i was killed.
	killedFrontend map[int]time.Time
	// workerKills excuse that many sessions broken by a killed or frozen
	// worker (an agent relays its browser's sessions: they stop with it).
	workerKills []workerKill
	// slowRefusal, when set, is the longest a refused session may take
	// during an outage.
	slowRefusal time.Duration
	notes       []string
	failures    []string
	finished    bool
	// stopped is when the clients were told to stop: the grid must heal
	// while traffic runs, not because it ended.
	stopped     time.Time
	leaked      int
	phantomLife int
}

type workerKill struct {
	at   time.Time
	live int
	// until is when a frozen worker resumed (zero: killed).
	until time.Time
}

// phase returns the short or the full length of a phase.
func (r *run) phase(short, full time.Duration) time.Duration {
	if r.short {
		return short
	}
	return full
}

func (r *run) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// grid starts the scenario's Caddy instances (one per limits) and n
// workers of capacity workerCap, on topology topo, and waits until all
// workers are available.
func (r *run) grid(topo func() (*topology, error), caddies []limits, n, workerCap int) error {
	t, err := topo()
	if err != nil {
		return fmt.Errorf("starting Redis: %w", err)
	}
	r.e.topo = t
	r.reg = registry.New(t.rdb, registry.Options{})
	for i, lim := range caddies {
		if _, err := r.e.startCaddy(fmt.Sprintf("caddy-%c", 'a'+i), lim); err != nil {
			return err
		}
	}
	for i := 1; i <= n; i++ {
		if _, err := r.e.startWorker(i, workerCap); err != nil {
			return err
		}
	}
	return r.waitWorkers(n)
}

// waitWorkers waits until n fresh workers are registered.
func (r *run) waitWorkers(n int) error {
	return poll(60*time.Second, 100*time.Millisecond, fmt.Sprintf("%d workers registered", n), func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		info, err := r.reg.Inspect(ctx, Pool)
		if err != nil {
			return false, err
		}
		fresh := 0
		for _, w := range info.Workers {
			if time.Since(w.LastHeartbeat) < staleThreshold && w.Status == "available" {
				fresh++
			}
		}
		if fresh >= n {
			return true, nil
		}
		for _, w := range r.e.workers {
			if w.p.exited() {
				return false, fmt.Errorf("%s exited; its log ends:\n%s", w.name, w.p.tail(1500))
			}
		}
		return false, fmt.Errorf("%d of %d workers available", fresh, n)
	})
}

// clients sets up the traffic through every Caddy of the scenario and
// the sampler; concurrency is the largest max_concurrent in force and
// lifetimeAt the max_lifetime in force at a moment.
func (r *run) clients(concurrency int, lifetimeAt func(time.Time) int, interval time.Duration) {
	var urls []string
	for _, c := range r.e.caddies {
		urls = append(urls, c.url())
	}
	r.tr = newTraffic(urls, 20*time.Second)
	r.smp = newSampler(r.reg, interval, concurrency, lifetimeAt)
	r.smp.logf = r.logf
	r.smp.start()
}

// reload applies lim to Caddy instance i with `caddy reload`, and notes
// the listener swap it makes (see run.swaps): a handshake it cuts began
// before the old listener closed, so the swap ends when the port is seen
// with one listener again.
func (r *run) reload(i int, lim limits) error {
	c := r.e.caddies[i]
	start := time.Now()
	if err := c.reload(r.e.bins, lim); err != nil {
		return err
	}
	end, err := oneListener(c.port, 10*time.Second)
	r.swaps = append(r.swaps, [2]time.Time{start, end})
	r.logf("reloaded %s: its old listener closed %s after the reload began", c.name, end.Sub(start).Round(time.Millisecond))
	if err != nil {
		return fmt.Errorf("after reloading %s: %w", c.name, err)
	}
	return nil
}

func countOf(outs []*outcome, f func(*outcome) bool) int {
	n := 0
	for _, o := range outs {
		if f(o) {
			n++
		}
	}
	return n
}

// fault records the moment the fault ended (or struck, for an instant
// one), from which time to heal is measured.
func (r *run) fault(at time.Time) {
	r.faultAt = at
	r.logf("fault at %s", at.UTC().Format("15:04:05.000"))
}

// observe keeps the traffic going after the fault until the grid looks
// healed (counts right and sessions served, for settle) or the heal
// bound (plus settle) has passed.
func (r *run) observe() {
	settle := r.phase(1500*time.Millisecond, 5*time.Second)
	deadline := r.faultAt.Add(r.healBound + settle)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		if time.Since(r.faultAt) < settle+time.Second {
			continue
		}
		since := time.Now().Add(-settle)
		good, seen := true, 0
		for _, s := range r.smp.all() {
			if !s.at.Before(since) {
				seen++
				good = good && !s.bad
			}
		}
		if !good || seen == 0 {
			continue
		}
		r.classify(r.tr.snapshot())
		served := false
		for _, o := range r.tr.snapshot() {
			if o.end.After(since) && o.err != nil && !o.excused {
				good = false
			}
			if o.opened.After(since) {
				served = true
			}
		}
		if good && served {
			return
		}
	}
}

// finish stops the clients, waits up to two heartbeats (and the pending
// grace) for Redis to hold no slot beyond the live sessions, and stops
// sampling.
func (r *run) finish() {
	if r.finished || r.tr == nil {
		return
	}
	r.finished = true
	r.stopped = time.Now()
	r.tr.stop()
	stopped := time.Now()
	_ = poll(healBound+time.Second, 100*time.Millisecond, "no leaked slot", func() (bool, error) {
		s := r.smp.latest()
		return s.at.After(stopped.Add(200*time.Millisecond)) && s.redisOK && s.leak == 0 && s.live == 0, nil
	})
	r.smp.close()
	s := r.smp.latest()
	r.leaked = s.leak
	if !s.redisOK {
		r.leaked = -1
	}
	r.phantomLife = r.phantomLifetime()
}

// phantomLifetime compares, once everything is quiet, each worker's
// lifetime count in Redis with the sessions its browser really served:
// a claim that timed out or ran twice leaves a count with no session.
func (r *run) phantomLifetime() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := r.reg.Inspect(ctx, Pool)
	if err != nil {
		return 0
	}
	r.smp.mu.Lock()
	defer r.smp.mu.Unlock()
	n, lost := 0, 0
	for _, w := range info.Workers {
		ep, ok := r.smp.eps[w.ID]
		if !ok || !ep.reachable {
			continue
		}
		if d := w.Lifetime - int(ep.sessions); d > 0 {
			n += d
		} else {
			lost -= d
		}
	}
	if lost > 0 {
		// A vanished record's sessions no longer count toward
		// max_lifetime; an overshoot shows only where a limit is near.
		r.note("%d served sessions missing from the workers' lifetime counts", lost)
	}
	return n
}

// classify marks the failed sessions the scenario's faults excuse.
func (r *run) classify(outs []*outcome) {
	kills := make([]int, len(r.workerKills))
	for _, o := range outs {
		o.excused, o.swapCut = false, false
		if o.err == nil {
			continue
		}
		if at, ok := r.killedFrontend[o.frontend]; ok && !o.end.Before(at) && o.start.Before(at.Add(time.Second)) {
			o.excused = true
			continue
		}
		if o.cut {
			for _, w := range r.swaps {
				if !o.start.After(w[1]) && !o.end.Before(w[0]) {
					o.excused, o.swapCut = true, true
				}
			}
			if o.swapCut {
				continue
			}
		}
		if !o.broke {
			for _, w := range r.outages {
				if !o.start.After(w[1]) && !o.end.Before(w[0]) && (r.slowRefusal == 0 || o.end.Sub(o.start) <= r.slowRefusal) {
					o.excused = true
				}
			}
			continue
		}
		for i, k := range r.workerKills {
			last := k.at
			if k.until.After(last) {
				last = k.until
			}
			// begun before the kill: a 101 the worker sent just before it
			// stopped reaches the client after
			if kills[i] < k.live && o.start.Before(k.at) && !o.end.Before(k.at) && o.end.Before(last.Add(5*time.Second)) {
				kills[i]++
				o.excused = true
				break
			}
		}
	}
}

// result turns what was measured into a table row and checks it.
func (r *run) result() Result {
	res := Result{Scenario: r.name, HealBound: r.healBound, Leaked: r.leaked}
	if r.tr == nil || r.smp == nil {
		res.Failures = append(res.Failures, "no traffic ran")
		return res
	}
	r.finish()
	outs := r.tr.snapshot()
	r.classify(outs)
	for _, o := range outs {
		res.Tried++
		switch {
		case o.err == nil:
			res.Served++
		case o.excused:
			res.Excused++
		default:
			res.Errors++
		}
	}
	res.OverAdmissions = r.smp.overAdmissions()
	res.Overshoots = r.smp.lifetimeOvershoots()
	if r.faultAt.IsZero() && r.healBound == 0 {
		res.Healed = true // nothing to heal from
	}
	if !r.faultAt.IsZero() {
		var during []sample
		for _, s := range r.smp.all() {
			if s.at.Before(r.stopped) {
				during = append(during, s)
			}
		}
		res.Heal, res.Healed = healTime(outs, during, r.faultAt)
	}
	res.Notes = append(res.Notes, r.notes...)
	if n := countOf(outs, func(o *outcome) bool { return o.swapCut }); n > 0 {
		reset := countOf(outs, func(o *outcome) bool { return o.swapCut && o.cutReset })
		res.Notes = append(res.Notes, fmt.Sprintf("%d handshakes cut by a reload's listener swap: %d reset while queued on the old listener, %d closed unanswered by the old server shutting down (Caddy, Go and Linux, not the grid)", n, reset, n-reset))
	}
	if r.e != nil {
		var logs []string
		for _, c := range r.e.caddies {
			logs = append(logs, c.p.log)
		}
		// A handler panic closes the client's connection unanswered, as
		// a reload's cut does: it must not pass for one.
		switch n, first, err := panicsIn(logs); {
		case err != nil:
			res.Failures = append(res.Failures, err.Error())
		case n > 0:
			if len(first) > 300 {
				first = first[:300] + "…"
			}
			res.Failures = append(res.Failures, fmt.Sprintf("Caddy logged %d handler panics, first: %s", n, first))
		}
	}
	if r.phantomLife > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d lifetime counts with no session", r.phantomLife))
	}
	if r.slowRefusal > 0 {
		slowest := time.Duration(0)
		for _, o := range outs {
			if o.err != nil && !o.broke && o.status > 0 && o.end.Sub(o.start) > slowest {
				slowest = o.end.Sub(o.start)
			}
		}
		res.Notes = append(res.Notes, fmt.Sprintf("slowest refusal %s", slowest.Round(10*time.Millisecond)))
		if slowest > r.slowRefusal {
			res.Failures = append(res.Failures, fmt.Sprintf("a refusal took %s (want ≤ %s)", slowest.Round(10*time.Millisecond), r.slowRefusal))
		}
	}
	res.Failures = append(res.Failures, r.failures...)
	res.Failures = append(res.Failures, check(res, r.phantomLife)...)
	if res.Errors > 0 {
		res.Notes = append(res.Notes, "first error: "+firstError(outs))
	}
	return res
}

// healSlack is the measurement's own error on a time to heal: the
// sampler reads the grid every 100 ms, and a read takes up to ~150 ms on
// a loaded machine.
const healSlack = 250 * time.Millisecond

// check compares a row with what must hold.
func check(res Result, phantomLife int) []string {
	var f []string
	if res.Served == 0 {
		f = append(f, "nothing served")
	}
	if res.Errors > 0 {
		f = append(f, fmt.Sprintf("%d client-visible errors (want 0)", res.Errors))
	}
	if res.Leaked != 0 {
		f = append(f, fmt.Sprintf("%d slots leaked (want 0)", res.Leaked))
	}
	if res.OverAdmissions > 0 {
		f = append(f, fmt.Sprintf("%d over-admissions (want 0)", res.OverAdmissions))
	}
	if res.Overshoots > 0 {
		f = append(f, fmt.Sprintf("%d lifetime overshoots (want 0)", res.Overshoots))
	}
	if phantomLife > 0 {
		f = append(f, fmt.Sprintf("%d lifetime counts with no session (want 0)", phantomLife))
	}
	switch {
	case !res.Healed:
		f = append(f, fmt.Sprintf("not healed (want ≤ %s)", res.HealBound.Round(100*time.Millisecond)))
	case res.Heal > res.HealBound+healSlack:
		f = append(f, fmt.Sprintf("healed in %s (want ≤ %s)", res.Heal.Round(100*time.Millisecond), res.HealBound.Round(100*time.Millisecond)))
	}
	return f
}

func firstError(outs []*outcome) string {
	var first *outcome
	for _, o := range outs {
		if o.err != nil && !o.excused && (first == nil || o.end.Before(first.end)) {
			first = o
		}
	}
	if first == nil {
		return ""
	}
	msg := first.err.Error()
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	return fmt.Sprintf("%s (through frontend %d, after %s)", msg, first.frontend, first.end.Sub(first.start).Round(time.Millisecond))
}

// healTime is the time from the fault to the first moment from which
// every sample had the counts right and no client saw an error, and at
// which a session had been served since; false when that never came.
func healTime(outs []*outcome, samples []sample, fault time.Time) (time.Duration, bool) {
	countsOK := fault
	for i, s := range samples {
		if s.at.Before(fault) || !s.bad {
			continue
		}
		if i+1 == len(samples) {
			return 0, false
		}
		countsOK = samples[i+1].at
	}
	lastErr := fault
	for _, o := range outs {
		if o.err != nil && !o.excused && o.end.After(lastErr) {
			lastErr = o.end
		}
	}
	served := time.Time{}
	for _, o := range outs {
		if !o.opened.IsZero() && !o.opened.Before(lastErr) && (served.IsZero() || o.opened.Before(served)) {
			served = o.opened
		}
	}
	if served.IsZero() {
		return 0, false
	}
	healed := countsOK
	if served.After(healed) {
		healed = served
	}
	return healed.Sub(fault), true
}

var execLookPath = exec.LookPath

// selectScenarios is what -only runs: every scenario for "", else for each
// comma-separated word the scenario of that name when there is one (so
// that redis-restart does not also run redis-restart-spent), else those
// whose name contains it; in the table's order.
func selectScenarios(all []Scenario, only string) []Scenario {
	if only == "" {
		return all
	}
	words := strings.Split(only, ",")
	exact := func(w string) bool {
		return slices.ContainsFunc(all, func(s Scenario) bool { return s.Name == w })
	}
	var out []Scenario
	for _, s := range all {
		if slices.ContainsFunc(words, func(w string) bool {
			w = strings.TrimSpace(w)
			if w == "" {
				return false
			}
			if exact(w) {
				return s.Name == w
			}
			return strings.Contains(s.Name, w)
		}) {
			out = append(out, s)
		}
	}
	return out
}
