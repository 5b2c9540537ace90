package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/internal/netns"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Client traffic shared by the scenarios: churners open sessions of
// churnHold back to back; select_timeout bounds a queued claim.
const (
	churnHold     = 300 * time.Millisecond
	selectTimeout = 5 * time.Second
	// noLifetime is a max_lifetime no scenario reaches unless it lowers
	// it, so that drains do not mix into faults about something else.
	noLifetime = 100000
)

func constant(n int) func(time.Time) int { return func(time.Time) int { return n } }

func (r *run) single(debug bool) func() (*topology, error) {
	return func() (*topology, error) { return r.e.startSingle(debug) }
}

// warm lets the traffic run before the fault (traffic, not a wait for a
// condition).
func (r *run) warm() { time.Sleep(r.phase(1500*time.Millisecond, 6*time.Second)) }

// waitServed waits until n sessions have been served in full.
func (r *run) waitServed(n int) error {
	return poll(60*time.Second, 50*time.Millisecond, fmt.Sprintf("%d sessions served", n), func() (bool, error) {
		got := 0
		for _, o := range r.tr.snapshot() {
			if o.err == nil {
				got++
			}
		}
		return got >= n, fmt.Errorf("%d served", got)
	})
}

// workerID returns the ID of the fresh record of a worker started as
// name.
func (r *run) workerID(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := r.reg.Inspect(ctx, Pool)
	if err != nil {
		return "", fmt.Errorf("finding %s's browser: %w", name, err)
	}
	for _, w := range info.Workers {
		if strings.HasPrefix(w.ID, name+"-") && time.Since(w.LastHeartbeat) < staleThreshold && w.Status == "available" {
			return w.ID, nil
		}
	}
	return "", fmt.Errorf("no fresh record of %s", name)
}

// restartRedisEmpty kills the single Redis (kill -9) and starts it again
// with no data on the same port: the outage excuses what failed meanwhile,
// and the restart is the fault to heal from.
func (r *run) restartRedisEmpty() error { return r.restartRedis(0, nil) }

// restartRedis kills the single Redis (kill -9) and starts it again:
// empty, or, with snapshot > 0, loading an RDB snapshot it SAVEd that long
// before the kill (the data comes back older, under the same epoch).
// atKill, when not nil, runs just before the kill.
func (r *run) restartRedis(snapshot time.Duration, atKill func()) error {
	n := r.e.topo.nodes[0]
	if snapshot > 0 {
		if out, err := n.cli("save"); err != nil {
			return fmt.Errorf("SAVE: %w: %s", err, out)
		}
		time.Sleep(snapshot)
	}
	if atKill != nil {
		atKill()
	}
	down := time.Now()
	n.p.kill9()
	if err := n.start(r.e); err != nil {
		return fmt.Errorf("restarting Redis: %w", err)
	}
	up := time.Now()
	r.outages = append(r.outages, [2]time.Time{down, up})
	if snapshot > 0 {
		r.note("Redis down %s, back with a snapshot %s older", up.Sub(down).Round(time.Millisecond), snapshot)
	} else {
		r.note("Redis down %s", up.Sub(down).Round(time.Millisecond))
	}
	r.fault(up)
	return nil
}

// spentRestart is the redis-restart scenarios with short sessions: four
// workers of capacity 3 with max_lifetime 10 under five clients opening
// short sessions, and Redis restarted (restartRedis: empty, or from a
// snapshot that much older) while browsers are near their lifetime. With
// moved, two Caddies: the clients use the first until the kill, then the
// second (a load balancer's choice), so the one that served the sessions
// Redis lost makes no claim after the restart.
func spentRestart(r *run, snapshot time.Duration, moved bool) error {
	lim := limits{MaxConcurrent: 3, MaxLifetime: 10, SelectTimeout: selectTimeout}
	lims := []limits{lim}
	if moved {
		lims = append(lims, lim)
	}
	if err := r.grid(r.single(false), lims, 4, 3); err != nil {
		return err
	}
	r.clients(3, constant(lim.MaxLifetime), 100*time.Millisecond)
	var move func()
	if moved {
		r.tr.down[1].Store(true)
		move = func() {
			r.tr.down[1].Store(false)
			r.tr.down[0].Store(true)
		}
	}
	r.tr.churn(5, churnHold)
	r.warm()
	if err := r.restartRedis(snapshot, move); err != nil {
		return err
	}
	// long enough for a worker that came back short of what it served to
	// reach max_lifetime again at this rate
	time.Sleep(r.phase(4*time.Second, 8*time.Second))
	r.observe()
	return nil
}

// liveAt reads a browser's live sessions right now from its /stats.
func liveAt(addr string) (int, error) {
	c := &http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/stats")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var st stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, err
	}
	return int(st.Active), nil
}

var scenarios = []Scenario{
	{
		Name: "lifetime-reload",
		Proves: "max_lifetime lowered by `caddy reload` mid-traffic (20 → 5, three workers): the new config's claims tell " +
			"the workers at or past the new limit to drain, one at a time, and the pool keeps serving; no session begins past the new limit.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 2, MaxLifetime: 20, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 3, 2); err != nil {
				return err
			}
			var lowered atomic.Int64
			r.clients(2, func(t time.Time) int {
				if at := lowered.Load(); at != 0 && t.UnixNano() >= at {
					return 5
				}
				return 20
			}, 100*time.Millisecond)
			r.tr.churn(4, churnHold)
			if err := r.waitServed(8); err != nil {
				return err
			}
			lim.MaxLifetime = 5
			if err := r.reload(0, lim); err != nil {
				return err
			}
			// A claim the old config granted just before the reload
			// finished may reach its browser a moment later: the new limit
			// applies to sessions from 300 ms after.
			done := time.Now()
			lowered.Store(done.Add(300 * time.Millisecond).UnixNano())
			r.fault(done)
			r.observe()
			return nil
		},
	},
	{
		Name: "policy-cycle",
		Proves: "eight `caddy reload`s under traffic that cycle the policy (lifetime_first, vnode, fair_share, " +
			"interleaved_weighted_round_robin), max_concurrent (3, 2, 1) and stagger_drains, max_lifetime 15 so workers " +
			"keep draining (browsers of capacity 6): no browser above 3 at once or past 15 sessions, no leak, the pool keeps serving.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 3, MaxLifetime: 15, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 4, 6); err != nil {
				return err
			}
			r.clients(3, constant(15), 100*time.Millisecond)
			r.tr.churn(10, churnHold)
			r.warm()
			cycle := []limits{
				{MaxConcurrent: 2, MaxLifetime: 15, SelectTimeout: selectTimeout, Policy: "vnode"},
				{MaxConcurrent: 3, MaxLifetime: 15, SelectTimeout: selectTimeout, Policy: "fair_share"},
				{MaxConcurrent: 2, MaxLifetime: 15, SelectTimeout: selectTimeout, Policy: "interleaved_weighted_round_robin"},
				{MaxConcurrent: 3, MaxLifetime: 15, SelectTimeout: selectTimeout, Policy: "lifetime_first"},
				{MaxConcurrent: 3, MaxLifetime: 15, SelectTimeout: selectTimeout, Policy: "vnode", Extra: "stagger_drains on"},
				{MaxConcurrent: 1, MaxLifetime: 15, SelectTimeout: selectTimeout, Policy: "lifetime_first", Extra: "stagger_drains off"},
				{MaxConcurrent: 3, MaxLifetime: 15, SelectTimeout: selectTimeout, Policy: "fair_share", Extra: "stagger_drains on"},
				{MaxConcurrent: 3, MaxLifetime: 15, SelectTimeout: selectTimeout},
			}
			for _, l := range cycle {
				time.Sleep(r.phase(700*time.Millisecond, 1500*time.Millisecond))
				if err := r.reload(0, l); err != nil {
					return err
				}
			}
			r.fault(time.Now())
			r.observe()
			return nil
		},
	},
	{
		Name: "two-policy-reloads",
		Proves: "two instances (lifetime_first 2/12 and vnode 3/20) on one pool, the first reloaded seven times through " +
			"every policy, max_concurrent 1-3 and max_lifetime 8-20: no browser above the largest max_concurrent or past " +
			"the largest max_lifetime, no leak, the pool keeps serving.",
		run: func(r *run) error {
			a := limits{MaxConcurrent: 2, MaxLifetime: 12, SelectTimeout: selectTimeout}
			b := limits{MaxConcurrent: 3, MaxLifetime: 20, SelectTimeout: selectTimeout, Policy: "vnode"}
			if err := r.grid(r.single(false), []limits{a, b}, 4, 6); err != nil {
				return err
			}
			r.clients(3, constant(20), 100*time.Millisecond)
			r.tr.churn(12, churnHold)
			r.warm()
			cycle := []limits{
				{MaxConcurrent: 3, MaxLifetime: 12, SelectTimeout: selectTimeout, Policy: "fair_share"},
				{MaxConcurrent: 2, MaxLifetime: 20, SelectTimeout: selectTimeout, Policy: "interleaved_weighted_round_robin"},
				{MaxConcurrent: 3, MaxLifetime: 8, SelectTimeout: selectTimeout, Policy: "lifetime_first"},
				{MaxConcurrent: 1, MaxLifetime: 20, SelectTimeout: selectTimeout, Policy: "vnode", Extra: "stagger_drains on"},
				{MaxConcurrent: 2, MaxLifetime: 12, SelectTimeout: selectTimeout},
				{MaxConcurrent: 3, MaxLifetime: 20, SelectTimeout: selectTimeout, Policy: "fair_share"},
				{MaxConcurrent: 2, MaxLifetime: 12, SelectTimeout: selectTimeout},
			}
			for _, l := range cycle {
				time.Sleep(r.phase(700*time.Millisecond, 1500*time.Millisecond))
				if err := r.reload(0, l); err != nil {
					return err
				}
			}
			r.fault(time.Now())
			r.observe()
			return nil
		},
	},
	{
		Name: "two-instances",
		Proves: "two Caddy instances with different limits (max_lifetime 20 and 5) share a pool during a rolling deploy: " +
			"the pool keeps serving through both, no browser holds more than the larger max_concurrent or serves past the larger max_lifetime.",
		run: func(r *run) error {
			a := limits{MaxConcurrent: 2, MaxLifetime: 20, SelectTimeout: selectTimeout}
			b := limits{MaxConcurrent: 2, MaxLifetime: 5, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{a, b}, 3, 2); err != nil {
				return err
			}
			r.clients(2, constant(20), 100*time.Millisecond)
			r.tr.down[1].Store(true) // the new instance joins the rotation later
			r.tr.churn(4, churnHold)
			if err := r.waitServed(8); err != nil {
				return err
			}
			r.tr.down[1].Store(false)
			r.fault(time.Now())
			r.observe()
			return nil
		},
	},
	{
		Name: "long-drain",
		Proves: "one session held open on the first worker to reach max_lifetime (20; four workers of capacity 3, stagger_drains " +
			"on by default) while six clients open short sessions: the pool keeps serving while that worker drains the long " +
			"session (its replacement serves as soon as it took its last session), the other workers retiring in turn; " +
			"no session refused, no overshoot, no leak.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 3, MaxLifetime: 20, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 4, 3); err != nil {
				return err
			}
			r.clients(3, constant(lim.MaxLifetime), 100*time.Millisecond)
			// Opened first, so on the worker lifetime_first fills first.
			if got := r.tr.hold(1, -1); got != 1 {
				return fmt.Errorf("opened %d of 1 long session", got)
			}
			// The worker holding it: the only one with a session so far.
			held := ""
			status := func() (string, error) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				info, err := r.reg.Inspect(ctx, Pool)
				if err != nil {
					return "", err
				}
				for _, w := range info.Workers {
					if (held == "" && w.Active == 1) || w.ID == held {
						held = w.ID
						return w.Status, nil
					}
				}
				return "gone", nil
			}
			if _, err := status(); err != nil {
				return err
			}
			r.tr.churn(6, churnHold)
			err := poll(30*time.Second, 50*time.Millisecond, held+" draining its long session", func() (bool, error) {
				st, err := status()
				return st == "draining" || st == "replaced", err
			})
			if err != nil {
				return err
			}
			r.note("%s draining its long session", held)
			r.fault(time.Now())
			// Every other worker reaches its last session within a few
			// seconds at this rate; the long session stays open for the
			// whole phase, inside the agents' 30 s drain timeout.
			time.Sleep(r.phase(12*time.Second, 20*time.Second))
			r.observe()
			return nil
		},
	},
	{
		Name: "operator-drain",
		Proves: "an operator drains the busiest worker through the admin API (four workers of capacity 3, six clients opening " +
			"short sessions): it takes no new session from that moment, its agent hears it at once (not at its next heartbeat), " +
			"it drains and restarts, and the pool keeps serving with no session refused.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 3, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 4, 3); err != nil {
				return err
			}
			r.clients(3, constant(noLifetime), 100*time.Millisecond)
			r.tr.churn(6, churnHold)
			r.warm()
			read := func() (registry.GroupInfo, error) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				return r.reg.Inspect(ctx, Pool)
			}
			info, err := read()
			if err != nil {
				return err
			}
			// lifetime_first's favourite: the worker most likely to be
			// given a session next
			var target registry.WorkerInfo
			for _, w := range info.Workers {
				if w.Status == "available" && w.Lifetime > target.Lifetime {
					target = w
				}
			}
			if target.ID == "" {
				return errors.New("no worker has served a session")
			}
			url := fmt.Sprintf("http://127.0.0.1:%d/grid/pools/%s/workers/%s/drain", r.e.caddies[0].adminPort, Pool, target.ID)
			resp, err := http.Post(url, "application/json", nil)
			if err != nil {
				return fmt.Errorf("draining %s through the admin API: %w", target.ID, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("draining %s through the admin API: %s", target.ID, resp.Status)
			}
			r.fault(time.Now())
			// Its lifetime once the drain is in: every claim after it
			// would add to it until its record is gone.
			info, err = read()
			if err != nil {
				return err
			}
			base, last := -1, -1
			for _, w := range info.Workers {
				if w.ID == target.ID {
					base, last = w.Lifetime, w.Lifetime
				}
			}
			if base < 0 {
				return fmt.Errorf("%s vanished right after its drain", target.ID)
			}
			err = poll(30*time.Second, 10*time.Millisecond, target.ID+" gone", func() (bool, error) {
				info, err := read()
				if err != nil {
					return false, err
				}
				for _, w := range info.Workers {
					if w.ID == target.ID {
						last = max(last, w.Lifetime)
						return false, fmt.Errorf("%s %s, lifetime %d", w.ID, w.Status, w.Lifetime)
					}
				}
				return true, nil
			})
			if err != nil {
				return err
			}
			r.note("%s took %d sessions after the operator's drain (lifetime %d at the drain)", target.ID, last-base, base)
			if last > base {
				r.failures = append(r.failures, fmt.Sprintf("%d sessions admitted by %s after its drain", last-base, target.ID))
			}
			if err := r.waitWorkers(4); err != nil {
				return err
			}
			r.observe()
			return nil
		},
	},
	{
		Name: "agent-frozen",
		Proves: "an agent frozen (SIGSTOP) past the stale threshold while its browser holds sessions at capacity, then resumed: " +
			"its own sessions stop with it (they are excused), its record is skipped and removed meanwhile, and it registers " +
			"again with the sessions it still holds, so they count against max_concurrent again (no over-admission).",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 2, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 1, 2); err != nil {
				return err
			}
			r.clients(2, constant(noLifetime), 100*time.Millisecond)
			if got := r.tr.hold(2, -1); got != 2 {
				return fmt.Errorf("opened %d of 2 sessions on worker-1", got)
			}
			for i := 2; i <= 4; i++ {
				if _, err := r.e.startWorker(i, 2); err != nil {
					return err
				}
			}
			if err := r.waitWorkers(4); err != nil {
				return err
			}
			// More demand than the three other workers' six slots, as a
			// busy grid has: a slot that looks free is taken at once.
			r.tr.churn(7, churnHold)
			r.warm()
			return r.freezeAgent(r.e.workers[0], r.phase(staleThreshold+reaperInterval+time.Second, 12*time.Second))
		},
	},
	{
		Name: "agent-frozen-spent",
		Proves: "an agent frozen (SIGSTOP) past the stale threshold once its browser has served most of its max_lifetime " +
			"(10), then resumed: its record was removed meanwhile, and it registers again with the lifetime it served, so " +
			"it serves no session past max_lifetime (no overshoot).",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 3, MaxLifetime: 10, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 4, 3); err != nil {
				return err
			}
			r.clients(3, constant(lim.MaxLifetime), 100*time.Millisecond)
			r.tr.churn(5, churnHold)
			// Frozen once some browser has served 6: lifetime_first fills
			// one at a time, so that is the one the next claims go to.
			var agent *workerInst
			err := poll(30*time.Second, 20*time.Millisecond, "a browser at lifetime 6", func() (bool, error) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				info, err := r.reg.Inspect(ctx, Pool)
				if err != nil {
					return false, err
				}
				for _, w := range info.Workers {
					if w.Lifetime >= 6 && w.Status == "available" {
						for _, a := range r.e.workers {
							if strings.HasPrefix(w.ID, a.name+"-") {
								agent = a
								return true, nil
							}
						}
					}
				}
				return false, nil
			})
			if err != nil {
				return err
			}
			return r.freezeAgent(agent, staleThreshold+reaperInterval+time.Second)
		},
	},
	{
		Name: "redis-restart",
		Proves: "Redis killed and restarted empty under 50 live sessions: the agents register again with their live " +
			"sessions as soon as their connection is back, so they keep counting (no over-admission), no slot leaks, and " +
			"the grid serves again within two heartbeats of the restart.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 8, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 8, 8); err != nil {
				return err
			}
			r.clients(8, constant(noLifetime), 100*time.Millisecond)
			if got := r.tr.hold(50, -1); got != 50 {
				return fmt.Errorf("opened %d of 50 live sessions", got)
			}
			r.tr.churn(6, churnHold)
			r.warm()
			if err := r.restartRedisEmpty(); err != nil {
				return err
			}
			r.observe()
			return nil
		},
	},
	{
		Name: "redis-restart-spent",
		Proves: "Redis killed and restarted empty while five clients open short sessions on four workers of capacity 3 with " +
			"max_lifetime 10: every agent registers again with the lifetime its browser served, and refuses a claim past " +
			"max_lifetime meanwhile, so no browser serves past it.",
		run: func(r *run) error { return spentRestart(r, 0, false) },
	},
	{
		Name: "redis-restart-snapshot",
		Proves: "Redis killed and restarted from an RDB snapshot 1.5 s older, while five clients open short sessions on " +
			"four workers of capacity 3 with max_lifetime 10: the records come back with counts too low, the agents' next " +
			"heartbeat sets them right and the agents refuse what would go past their limits meanwhile: no overshoot.",
		run: func(r *run) error { return spentRestart(r, 1500*time.Millisecond, false) },
	},
	{
		Name: "redis-restart-snapshot-moved",
		Proves: "Redis killed and restarted from an RDB snapshot 1.5 s older as five clients move from one Caddy to another: " +
			"the instance that claimed the lost sessions makes no claim afterwards, and still no browser serves past " +
			"max_lifetime through the other (the agents hold it).",
		run: func(r *run) error { return spentRestart(r, 1500*time.Millisecond, true) },
	},
	{
		Name: "redis-restart-moved",
		Proves: "Redis killed and restarted empty as five clients move from one Caddy to another (a load balancer's " +
			"choice): no browser serves past max_lifetime through the other instance either.",
		run: func(r *run) error { return spentRestart(r, 0, true) },
	},
	{
		Name: "redis-stall",
		Proves: "Redis stalled (DEBUG SLEEP 7) during claims: a claim is refused within ~2.5 s (not when Redis wakes), a " +
			"claim that timed out leaves no count once Redis answers again, and the workers, stale meanwhile, come back " +
			"with their live sessions counted at their next heartbeat.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 4, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(true), []limits{lim}, 4, 4); err != nil {
				return err
			}
			r.clients(4, constant(noLifetime), 100*time.Millisecond)
			if got := r.tr.hold(4, -1); got != 4 {
				return fmt.Errorf("opened %d of 4 live sessions", got)
			}
			r.tr.churn(6, churnHold)
			r.warm()
			r.slowRefusal = 3 * time.Second
			stalled := time.Now()
			if out, err := r.e.topo.nodes[0].cliWithin(20*time.Second, "debug", "sleep", "7"); err != nil {
				return fmt.Errorf("DEBUG SLEEP: %w: %s", err, out)
			}
			woke := time.Now()
			r.outages = append(r.outages, [2]time.Time{stalled, woke})
			r.note("Redis stalled %s", woke.Sub(stalled).Round(time.Millisecond))
			r.fault(woke)
			r.observe()
			return nil
		},
	},
	{
		Name: "cluster-failover",
		Proves: "Redis Cluster (3 masters + 3 replicas, replicas in sync): the master owning the pool's slot killed under traffic " +
			"costs no more than the failover: sessions served again within 5 s of the replica's promotion.",
		run: func(r *run) error { return r.failover(r.e.startCluster) },
	},
	{
		Name: "sentinel-failover",
		Proves: "Redis Sentinel (master, replica, 3 sentinels; redis+sentinel:// URL): the master killed under traffic costs " +
			"no more than the failover, for Caddy and for the agents.",
		run: func(r *run) error { return r.failover(r.e.startSentinel) },
	},
	{
		Name: "worker-kill",
		Proves: "kill -9 of a worker (agent and browser) with live sessions: only its own sessions fail, its record and " +
			"slots are gone within the stale threshold and a reaper pass, the others keep serving.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 4, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 5, 4); err != nil {
				return err
			}
			r.clients(4, constant(noLifetime), 100*time.Millisecond)
			if got := r.tr.hold(8, -1); got != 8 {
				return fmt.Errorf("opened %d of 8 live sessions", got)
			}
			r.tr.churn(6, churnHold)
			r.warm()
			// The worker whose browser holds the most sessions.
			victim, most, id := (*workerInst)(nil), -1, ""
			for _, w := range r.e.workers {
				wid, err := r.workerID(w.name)
				if err != nil {
					continue
				}
				if n := r.smp.liveOn(wid); n > most {
					victim, most, id = w, n, wid
				}
			}
			if victim == nil {
				return fmt.Errorf("no worker to kill")
			}
			live, err := liveAt(r.smp.browserOf(id))
			if err != nil {
				return fmt.Errorf("reading %s's live sessions: %w", victim.name, err)
			}
			at := time.Now()
			victim.p.kill9()
			r.workerKills = append(r.workerKills, workerKill{at: at, live: live})
			// Its record is skipped once stale and removed by the next
			// reaper pass after that.
			r.healBound = staleThreshold + reaperInterval + time.Second
			r.note("%s killed with %d live sessions", victim.name, live)
			r.fault(at)
			r.observe()
			return nil
		},
	},
	{
		Name: "caddy-kill",
		Proves: "kill -9 of a Caddy instance holding 50 live sessions: only its sessions fail, their slots come back " +
			"as their agents see the connections close (a claim it made and never dialled, within a heartbeat and the " +
			"pending grace), the other instance keeps serving.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 8, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim, lim}, 8, 8); err != nil {
				return err
			}
			r.clients(8, constant(noLifetime), 100*time.Millisecond)
			if got := r.tr.hold(50, 0); got != 50 {
				return fmt.Errorf("opened %d of 50 live sessions through caddy-a", got)
			}
			r.tr.churn(6, churnHold)
			r.warm()
			at := time.Now()
			r.tr.down[0].Store(true)
			r.e.caddies[0].p.kill9()
			r.killedFrontend = map[int]time.Time{0: at}
			r.fault(at)
			r.observe()
			return nil
		},
	},
	{
		Name: "reload-live",
		Proves: "`caddy reload` under 100 live sessions: every live session survives, its slot stays counted and is " +
			"released when it ends; new sessions are served throughout.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 12, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 10, 12); err != nil {
				return err
			}
			r.clients(12, constant(noLifetime), 100*time.Millisecond)
			if got := r.tr.hold(100, -1); got != 100 {
				return fmt.Errorf("opened %d of 100 live sessions", got)
			}
			r.tr.churn(6, churnHold)
			r.warm()
			lim.SelectTimeout = selectTimeout + time.Second // a real change
			if err := r.reload(0, lim); err != nil {
				return err
			}
			r.fault(time.Now())
			r.observe()
			return nil
		},
	},
	{
		Name: "stale-5000",
		Proves: "5,000 stale workers (a lost zone: registered, then silent) beside 10 fresh ones, the reaper at its default " +
			"60 s: sessions keep being served and the stale records are gone by the reaper's first pass after they turn " +
			"stale: within its minute plus the pass.",
		run: func(r *run) error {
			// The reaper at its default cadence: what removes a lost zone
			// in production, beside the claims' own background expiry.
			lim := limits{MaxConcurrent: 2, MaxLifetime: noLifetime, SelectTimeout: selectTimeout, ReaperInterval: time.Minute}
			if err := r.grid(r.single(false), []limits{lim}, 10, 2); err != nil {
				return err
			}
			// Passes are at most ReaperInterval apart (reaper's
			// TestRegularPassesAreNeverMoreThanAnIntervalApart), and one that
			// starts just before the records turn stale leaves them to the
			// next: the bound is the interval plus that pass's work (5,000
			// records in 0.3 s in reaper's TestFiveThousandStaleWorkersGoFast)
			// and the harness's 250 ms sampling, with room for a loaded machine.
			r.healBound = lim.ReaperInterval + 2*time.Second
			r.clients(2, constant(noLifetime), time.Second)
			r.smp.extraBad = func(info registry.GroupInfo) bool {
				for _, w := range info.Workers {
					if time.Since(w.LastHeartbeat) > staleThreshold {
						return true
					}
				}
				return false
			}
			r.tr.churn(8, churnHold)
			r.warm()
			start := time.Now()
			// A client of its own: the harness's deadlines are for reads.
			wrdb := redis.NewClient(&redis.Options{Addr: r.e.topo.nodes[0].addr(), ReadTimeout: 10 * time.Second})
			defer wrdb.Close()
			if err := registerStale(registry.New(wrdb, registry.Options{}), 5000); err != nil {
				return err
			}
			r.note("5,000 records written in %s", time.Since(start).Round(time.Millisecond))
			r.fault(time.Now().Add(staleThreshold)) // when they turn stale
			time.Sleep(staleThreshold)
			r.observe()
			var before, after []time.Duration
			for _, o := range r.tr.snapshot() {
				switch {
				case o.opened.IsZero():
				case o.opened.Before(start):
					before = append(before, o.opened.Sub(o.start))
				case o.start.After(r.faultAt):
					after = append(after, o.opened.Sub(o.start))
				}
			}
			r.note("session open p99 %s before the lost zone, %s while it was stale", p99(before).Round(time.Millisecond), p99(after).Round(time.Millisecond))
			return nil
		},
	},
	{
		Name: "caddy-partition",
		Proves: "one Caddy's Redis link black-holed (bytes held, nothing closed) with 4 live sessions through it, while " +
			"another instance churns on the same 4 workers of capacity 2: the sessions through the cut-off instance go on " +
			"and stay counted (their agents report them), so nobody is admitted over a worker's cap; nothing leaks.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 2, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			t, err := r.e.startSingle(false)
			if err != nil {
				return err
			}
			r.e.topo = t
			r.reg = registry.New(t.rdb, registry.Options{})
			bh, err := newBlackhole("127.0.0.1:0", t.nodes[0].addr())
			if err != nil {
				return err
			}
			r.e.undo = append(r.e.undo, bh.close)
			if _, err := r.e.startCaddy("caddy-a", lim); err != nil {
				return err
			}
			if _, err := r.e.startCaddyAt("caddy-b", lim, caddyPlace{redisURL: "redis://" + bh.addr() + "/0"}); err != nil {
				return err
			}
			for i := 1; i <= 4; i++ {
				if _, err := r.e.startWorker(i, 2); err != nil {
					return err
				}
			}
			if err := r.waitWorkers(4); err != nil {
				return err
			}
			r.clients(2, constant(noLifetime), 100*time.Millisecond)
			if got := r.tr.hold(4, 1); got != 4 {
				return fmt.Errorf("opened %d of 4 live sessions through caddy-b", got)
			}
			r.tr.down[1].Store(true) // the churn goes through caddy-a
			r.tr.churn(6, churnHold)
			r.warm()
			d := r.phase(8*time.Second, 20*time.Second)
			at := time.Now()
			bh.hole(true)
			r.note("caddy-b's Redis link black-holed for %s", d)
			time.Sleep(d)
			bh.hole(false)
			r.outages = append(r.outages, [2]time.Time{at, time.Now()})
			r.fault(time.Now())
			r.observe()
			return nil
		},
	},
	{
		Name: "agent-kill",
		Proves: "kill -9 of an agent alone, with live sessions: its browser, its child, dies with it (no orphan), only " +
			"its sessions fail, its record and slots go within the stale threshold and a reaper pass, and the agent " +
			"started again (as a supervisor would) serves a fresh browser.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 4, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			if err := r.grid(r.single(false), []limits{lim}, 4, 4); err != nil {
				return err
			}
			r.clients(4, constant(noLifetime), 100*time.Millisecond)
			if got := r.tr.hold(8, -1); got != 8 {
				return fmt.Errorf("opened %d of 8 live sessions", got)
			}
			r.tr.churn(6, churnHold)
			r.warm()
			victim, most, id := (*workerInst)(nil), -1, ""
			for _, w := range r.e.workers {
				wid, err := r.workerID(w.name)
				if err != nil {
					continue
				}
				if n := r.smp.liveOn(wid); n > most {
					victim, most, id = w, n, wid
				}
			}
			if victim == nil {
				return fmt.Errorf("no agent to kill")
			}
			browser := r.smp.browserOf(id)
			live, err := liveAt(browser)
			if err != nil {
				return fmt.Errorf("reading %s's live sessions: %w", victim.name, err)
			}
			at := time.Now()
			victim.p.killOnly()
			r.workerKills = append(r.workerKills, workerKill{at: at, live: live})
			r.note("%s's agent killed with %d live sessions", victim.name, live)
			if err := poll(5*time.Second, 50*time.Millisecond, "its browser gone", func() (bool, error) {
				_, err := liveAt(browser)
				return err != nil, nil
			}); err != nil {
				r.failures = append(r.failures, "the killed agent's browser outlived it")
			}
			if _, err := r.e.procs.start(victim.name+"-again", nil, filepath.Join(r.e.bins, "grid-worker"), victim.args...); err != nil {
				return err
			}
			r.healBound = staleThreshold + reaperInterval + time.Second
			r.fault(at)
			r.observe()
			return nil
		},
	},
	{
		Name: "caddy-host-loss",
		Proves: "the link of one Caddy's host pulled (a network namespace whose veth goes down: no FIN, no reset) with 20 " +
			"live sessions through it: their agents find the dead connections within -proxy-timeout (3 s here, 15 s by " +
			"default) and end them, so their slots come back; the other instance keeps serving.",
		run: func(r *run) error {
			host, err := netns.New()
			if err != nil {
				return err
			}
			r.e.undo = append(r.e.undo, host.Remove)
			lim := limits{MaxConcurrent: 8, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
			t, err := r.e.startSingle(false)
			if err != nil {
				return err
			}
			r.e.topo = t
			r.reg = registry.New(t.rdb, registry.Options{})
			// The namespace reaches Redis through a forwarder on its link.
			fwd, err := newBlackhole(host.Service+":0", t.nodes[0].addr())
			if err != nil {
				return err
			}
			r.e.undo = append(r.e.undo, fwd.close)
			if _, err := r.e.startCaddy("caddy-a", lim); err != nil {
				return err
			}
			if _, err := r.e.startCaddyAt("caddy-b", lim, caddyPlace{host: host, redisURL: "redis://" + fwd.addr() + "/0"}); err != nil {
				return err
			}
			for i := 1; i <= 4; i++ {
				if _, err := r.e.startWorker(i, 8, "--host", "0.0.0.0", "--advertise", host.Service); err != nil {
					return err
				}
			}
			if err := r.waitWorkers(4); err != nil {
				return err
			}
			r.clients(8, constant(noLifetime), 100*time.Millisecond)
			if got := r.tr.hold(20, 1); got != 20 {
				return fmt.Errorf("opened %d of 20 live sessions through caddy-b", got)
			}
			r.tr.down[1].Store(true)
			r.tr.churn(6, churnHold)
			r.warm()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			held, _, err := r.reg.Sessions(ctx, Pool, 0, 1000)
			cancel()
			if err != nil {
				return err
			}
			through := map[string]bool{}
			for _, s := range held {
				if s.Claimed.Before(time.Now().Add(-time.Second)) {
					through[s.ID] = true // only caddy-b's held sessions last this long
				}
			}
			at := time.Now()
			if err := host.Cut(); err != nil {
				return err
			}
			r.killedFrontend = map[int]time.Time{1: at}
			r.fault(at)
			bound := proxyTimeout + heartbeatInterval
			err = poll(bound+5*time.Second, 50*time.Millisecond, "the lost host's sessions ended", func() (bool, error) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				ss, _, err := r.reg.Sessions(ctx, Pool, 0, 1000)
				if err != nil {
					return false, nil
				}
				for _, s := range ss {
					if through[s.ID] {
						return false, nil
					}
				}
				return true, nil
			})
			back := time.Since(at)
			r.note("the lost host's %d sessions ended %s after the cut", len(through), back.Round(100*time.Millisecond))
			if err != nil || back > bound+healSlack {
				r.failures = append(r.failures, fmt.Sprintf("the lost host's sessions ended after %s (want ≤ %s)", back.Round(100*time.Millisecond), bound))
			}
			r.healBound = bound
			r.observe()
			return nil
		},
	},
	{
		Name: "recycle-continuous",
		Proves: "two workers of max_concurrent 2 recycling at max_lifetime 3 with every default timing (10 s heartbeats, " +
			"select_timeout 5s, stagger_drains on, stale_threshold 30s), three clients opening 200 ms sessions back to back " +
			"through two instances: at least 10 restarts with no 503, no over-admission, no overshoot, never two workers retiring at once.",
		run: func(r *run) error {
			lim := limits{MaxConcurrent: 2, MaxLifetime: 3, SelectTimeout: selectTimeout, StaleThreshold: 30 * time.Second, ReaperInterval: time.Minute}
			t, err := r.e.startSingle(false)
			if err != nil {
				return err
			}
			r.e.topo = t
			r.reg = registry.New(t.rdb, registry.Options{})
			for _, n := range []string{"caddy-a", "caddy-b"} {
				if _, err := r.e.startCaddy(n, lim); err != nil {
					return err
				}
			}
			defaults := []string{"--heartbeat-interval", "10s", "--stale-threshold", "30s", "--proxy-timeout", "15s"}
			for i := 1; i <= 2; i++ {
				if _, err := r.e.startWorker(i, 2, defaults...); err != nil {
					return err
				}
			}
			if err := r.waitWorkers(2); err != nil {
				return err
			}
			r.clients(2, constant(lim.MaxLifetime), 50*time.Millisecond)
			r.tr.churn(3, 200*time.Millisecond)
			restarts := 10
			if !r.short {
				restarts = 20
			}
			err = poll(3*time.Minute, 100*time.Millisecond, fmt.Sprintf("%d restarts", restarts), func() (bool, error) {
				r.smp.mu.Lock()
				n := len(r.smp.eps) - 2
				r.smp.mu.Unlock()
				return n >= restarts, fmt.Errorf("%d restarts", n)
			})
			if err != nil {
				return err
			}
			r.smp.mu.Lock()
			r.note("%d restarts", len(r.smp.eps)-2)
			r.smp.mu.Unlock()
			most, noFree, longest := 0, time.Duration(0), time.Duration(0)
			var since time.Time
			for _, s := range r.smp.all() {
				most = max(most, s.retiring)
				switch {
				case s.free == 0 && since.IsZero():
					since = s.at
				case s.free > 0 && !since.IsZero():
					noFree = max(noFree, s.at.Sub(since))
					since = time.Time{}
				}
			}
			for _, o := range r.tr.snapshot() {
				if !o.opened.IsZero() {
					longest = max(longest, o.opened.Sub(o.start))
				}
			}
			r.note("at most %d retiring at once; longest wait for a slot %s; longest with no free slot %s",
				most, longest.Round(time.Millisecond), noFree.Round(time.Millisecond))
			if most > 1 {
				r.failures = append(r.failures, fmt.Sprintf("%d workers retiring at once (want ≤ 1)", most))
			}
			r.healBound = 0 // no fault to heal from: the figures above are the proof
			return nil
		},
	},
}

// failover runs a failover scenario on topology start: the master serving
// the pool is killed under traffic and the replica's promotion awaited.
func (r *run) failover(start func() (*topology, error)) error {
	lim := limits{MaxConcurrent: 4, MaxLifetime: noLifetime, SelectTimeout: selectTimeout}
	if err := r.grid(start, []limits{lim}, 4, 4); err != nil {
		return err
	}
	r.clients(4, constant(noLifetime), 100*time.Millisecond)
	if got := r.tr.hold(4, -1); got != 4 {
		return fmt.Errorf("opened %d of 4 live sessions", got)
	}
	r.tr.churn(6, churnHold)
	r.warm()
	t := r.e.topo
	var master, replica *redisNode
	if t.masterName != "" {
		master, replica = t.nodes[0], t.nodes[1]
	} else {
		var err error
		if master, replica, err = t.slotOwner(r.reg.Key(Pool, "workers")); err != nil {
			return err
		}
		if err := t.waitReplicasInSync(); err != nil {
			return err
		}
	}
	// Every write so far reached the replica.
	if out, err := master.cli("wait", "1", "2000"); err != nil || strings.TrimSpace(out) != "1" {
		return fmt.Errorf("WAIT for the replica of %s: %q %v", master.addr(), out, err)
	}
	at := time.Now()
	master.p.kill9()
	r.fault(at)
	var promoted time.Time
	if err := poll(60*time.Second, 50*time.Millisecond, "the replica's promotion", func() (bool, error) {
		return replica.isMaster(), nil
	}); err != nil {
		return err
	}
	promoted = time.Now()
	r.note("replica promoted %s after the kill", promoted.Sub(at).Round(100*time.Millisecond))
	// Issue 9: served again within 5 s of the promotion.
	r.healBound = promoted.Sub(at) + 5*time.Second
	r.outages = append(r.outages, [2]time.Time{at, promoted.Add(5 * time.Second)})
	r.observe()
	return nil
}

// registerStale writes n worker records the way agents of a lost zone
// left them: registered, then never heard from again. Their addresses
// are in TEST-NET-1 (never reachable).
func registerStale(reg *registry.Registry, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	var next atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				rec := registry.NewRecord(registry.Record{
					ID: fmt.Sprintf("lost-zone-%05d", i), Pool: Pool, Browser: Pool,
					Addr: fmt.Sprintf("192.0.2.%d:%d", i%250+1, 9000+i/250), Path: "/playwright", Capacity: 2,
				}, 0, nil)
				err := reg.Register(ctx, rec, registry.AgentState{}, "")
				cancel()
				if err != nil {
					select {
					case errs <- fmt.Errorf("registering stale worker %d: %w", i, err):
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// p99 is the 99th percentile of d (nearest rank).
func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)*99+99)/100-1]
}

// freezeAgent stops an agent (SIGSTOP) for d and resumes it. The sessions
// its browser held stop with it (it relays them) and are excused; the
// resume is the fault to heal from.
func (r *run) freezeAgent(w *workerInst, d time.Duration) error {
	id, err := r.workerID(w.name)
	if err != nil {
		return err
	}
	if err := w.p.freeze(); err != nil {
		return fmt.Errorf("freezing %s: %w", w.name, err)
	}
	// stopped now: what it serves is what its browser holds (a session
	// may have opened since the last sample)
	at := time.Now()
	live := r.smp.liveOn(id)
	if n, ok := r.smp.browserActive(id); ok {
		live = n
	}
	r.workerKills = append(r.workerKills, workerKill{at: at, live: live, until: at.Add(d)})
	r.note("%s frozen %s with %d live sessions", w.name, d, live)
	time.Sleep(d)
	if err := w.p.thaw(); err != nil {
		return fmt.Errorf("resuming %s: %w", w.name, err)
	}
	r.fault(time.Now())
	// long enough for a worker that came back short of what it served to
	// reach its max_lifetime again at this rate
	time.Sleep(r.phase(3*time.Second, 6*time.Second))
	r.observe()
	return nil
}
